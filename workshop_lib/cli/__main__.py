import sys

from workshop_lib.cli.main import main

sys.exit(main())

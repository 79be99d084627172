"""`python -m workshop_lib.site_check ...`: the setup steps' checks inside a site's environment.

The module path is frozen: setup plans and staged environments run it by this name. The code is
workshop_lib.sites.site_check."""

import sys

from workshop_lib.sites.site_check import main

if __name__ == "__main__":
    sys.exit(main())

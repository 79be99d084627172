"""Where the checkout and the tests' own data folders lie, for test modules at any depth under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # data/, samples/, lint_samples/ and the shared helper modules
REPO = TESTS.parent

"""Where the tests' data lives, for test modules at any depth under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/
REPO = TESTS.parent

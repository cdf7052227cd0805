"""`python -m training ...` is `refinery train ...` (what torchrun launches)."""

import sys

from refinery.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))

"""`python -m training ...` is `refinery train ...` (what torchrun launches), without loading the
other commands."""

import sys

from refinery import commands
from training import cli

if __name__ == "__main__":
    parser = commands.build_parser([cli], prog="refinery")
    sys.exit(commands.run(parser, ["train", *sys.argv[1:]]))

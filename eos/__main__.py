"""`python -m eos ...` is the `eos` command."""

import sys

from eos.cli import main

sys.exit(main())

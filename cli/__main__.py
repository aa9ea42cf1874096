"""`python -m kubeinfer.cli` is the `kubeinfer` console script."""

import sys

from kubeinfer.cli.main import main

sys.exit(main())

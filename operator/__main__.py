"""`python -m kubeinfer.operator` is the `kubeinfer` console script."""

import sys

from kubeinfer.operator.cli import main

sys.exit(main())

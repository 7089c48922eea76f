"""`python -m sagemaker_ops VERB ...`: see sagemaker_ops/cli.py."""

import sys

from .cli import main

sys.exit(main())

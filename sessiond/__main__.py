import sys

from sessiond.cli import main

sys.exit(main())

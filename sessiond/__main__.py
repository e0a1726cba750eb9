import sys

from sessiond.daemon.cli import main

sys.exit(main())

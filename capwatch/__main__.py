import sys

from capwatch.cli import main

sys.exit(main())

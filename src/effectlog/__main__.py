from effectlog.cli import main

raise SystemExit(main())

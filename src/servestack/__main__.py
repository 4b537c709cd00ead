from servestack.cli import main

raise SystemExit(main())

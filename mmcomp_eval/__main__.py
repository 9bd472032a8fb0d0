from mmcomp_eval.cli import main

raise SystemExit(main())

"""One process of a data-parallel run started by ``evaluate(num_processes=N)``.

Run as ``python -m mmcomp_eval.evaluation.worker`` by
:func:`mmcomp_eval.runtime.parallel.launch`, with ``evaluate``'s arguments
in the environment; process 0 hands its results record back to the launcher
through a file, so the launcher's caller gets it as from a single process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.evaluate import RESULTS_ENV, SPEC_ENV, evaluate


def main() -> int:
    spec = json.loads(os.environ[SPEC_ENV])
    try:
        results = evaluate(**spec)
    except UserError as exc:
        print(f"mmcomp-eval: error: {exc}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        return 130
    target = os.environ.get(RESULTS_ENV)
    if results is not None and target:
        Path(target).write_text(json.dumps(results, ensure_ascii=False, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

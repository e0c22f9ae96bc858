"""The errors that end the study with a message saying what was wrong and what to do: a check before a launch
(``StudyError``), a rank that refuses to go on (``RankRefusal``)."""

import sys
import time


class StudyError(RuntimeError):
    """A problem found before launching; the message says what to do."""


class RankRefusal(RuntimeError):
    """A rank will not go on, for a reason it can say (a damaged checkpoint, no checkpoint to restore): the rank
    program records it and prints it once, from rank 0, with no traceback; the message says what to do."""


REFUSED_EXIT_CODE = 3
"""The exit code of a rank that refused (``RankRefusal``): not a crash."""
REFUSAL_GRACE_S = 2.0
"""How long the other ranks wait before exiting: torchrun stops every rank once one exits, and rank 0 says it."""


def refuse(rank: int, refusal: BaseException) -> int:
    """Say a rank's refusal once, from rank 0 (every rank reached the same one), without a traceback; the exit code."""
    if rank == 0:
        print(f"error: {refusal}", file=sys.stderr, flush=True)
    else:
        time.sleep(REFUSAL_GRACE_S)
    return REFUSED_EXIT_CODE

"""The keyed BLAKE3 checkpoint chain: append, verify, revisions.

Link ``n`` is ``BLAKE3(key, canonical([subject type, subject id, n, kind, fact
fingerprint, link n-1]))``, with link 0 all zeros. A writer without the key cannot produce
a valid link, so a rewritten, removed, reordered or re-hashed checkpoint is detected.
Removing checkpoints from the *end* leaves a valid shorter chain: that is detected
against a watermark (a revision a reader saw earlier) and against the operation rows,
which remember the position of their latest checkpoint.

Six modules, each importing only the ones before it: :mod:`.links` writes and reads the
chain's rows, :mod:`.marks` keeps how far a run verified a chain (ADR 0034: a success
verifies only the tail after its run's mark), :mod:`.stored` seals a mark for the
subject's next run (ADR 0066), :mod:`.replay` recomputes a chain from rows
already read (no database), whole or from a mark, :mod:`.written` keeps what a run wrote
after its mark (ADR 0040: a standalone success checks it inside its write instead of
reading it), and :mod:`.verify` reads a subject's rows and verifies them. Import from this
package.
"""

from .links import (
    CHECKPOINT_COLUMNS,
    CHECKPOINT_TABLE,
    COMPARED,
    EMPTY,
    MARK_TABLE,
    OP_COLUMNS,
    SEAL_AS_CHECKPOINT,
    Head,
    Prepared,
    append,
    compute_link,
    conflict,
    conflict_of,
    insert_prepared,
    insert_statement,
    load_checkpoints,
    load_operations,
    load_sealed,
    prepare,
    read_head,
)
from .marks import (
    Mark,
    mark_drop,
    mark_forget,
    mark_keep,
    mark_peek,
    mark_whole,
    marks_clear,
    marks_of,
    whole_asked,
)
from .replay import Verification, compare, verify_marking, verify_rows, verify_tail
from .stored import Seal, seal, unseal
from .verify import VERIFY_ATTEMPTS, chain_verify, revision_require, subject_revision
from .written import forget as mark_forget_written
from .written import verified_through as mark_verified_through
from .written import wrote as mark_wrote

__all__ = [
    "CHECKPOINT_COLUMNS",
    "CHECKPOINT_TABLE",
    "COMPARED",
    "EMPTY",
    "MARK_TABLE",
    "OP_COLUMNS",
    "SEAL_AS_CHECKPOINT",
    "VERIFY_ATTEMPTS",
    "Head",
    "Mark",
    "Prepared",
    "Seal",
    "Verification",
    "append",
    "chain_verify",
    "compare",
    "compute_link",
    "conflict",
    "conflict_of",
    "insert_prepared",
    "insert_statement",
    "load_checkpoints",
    "load_operations",
    "load_sealed",
    "mark_drop",
    "mark_forget",
    "mark_forget_written",
    "mark_keep",
    "mark_peek",
    "mark_verified_through",
    "mark_whole",
    "mark_wrote",
    "marks_clear",
    "marks_of",
    "prepare",
    "read_head",
    "revision_require",
    "seal",
    "subject_revision",
    "unseal",
    "verify_marking",
    "verify_rows",
    "verify_tail",
    "whole_asked",
]

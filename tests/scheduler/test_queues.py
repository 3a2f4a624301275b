"""Queue names and message ids shared by the dispatcher and the workers."""

from __future__ import annotations

from apg_farm.scheduler import attempt_of, bed_queue, pool_queue, task_id


def test_pool_queue_names_are_tame_and_distinct() -> None:
    """Commas become '+' (celery -Q splits on commas); names that would collide after cleaning do not."""
    assert pool_queue("canvas_home,kb_docs") == "pool.canvas_home+kb_docs"
    assert "," not in pool_queue("a,b,c")
    assert pool_queue("a/b") != pool_queue("a_b")
    assert bed_queue("bed-1") == "bed.bed-1"


def test_message_ids_name_their_attempt() -> None:
    """The reconciler reads the attempt back from a message id; other ids are not attempts."""
    assert attempt_of(task_id(42, 3)) == 42
    assert attempt_of("celery-something") is None
    assert attempt_of("attempt-x-1") is None

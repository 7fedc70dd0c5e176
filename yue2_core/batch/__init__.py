"""Many songs at once (`python -m yue2_core batch REQUESTS.jsonl --output DIR`), issue #19, local part.

    requests.py  the vendor's request JSONL: rows parsed and validated one by one (driver side)
    memory.py    how many songs one AR batch holds within --budget
    runner.py    the worker: songs of different requests through one engine, AR phases batched, the render stage
                 on a worker thread beside the next batch's AR (`iter_songs`)
    driver.py    output folder, resume decisions, context and memory checks, batch.json (`run_batch`)
    summary.py   batch.json and the terminal table / progress

docs/batch.md describes the request format, memory sizing, resume and the equality guarantee.
"""
from .driver import BatchOptions, run_batch
from .requests import BatchRequest, RowError, check_context, read_requests
from .runner import SongOutcome, iter_songs, run_songs

__all__ = ["BatchOptions", "run_batch", "BatchRequest", "RowError", "check_context", "read_requests", "SongOutcome",
           "iter_songs", "run_songs"]

"""Run the re-delivery example: ``python -m examples.redelivery`` from the repository root.

Starts two real workers with a 2 s Redis visibility timeout, sends one export
of 10 chunks (about 5 s of work), and prints what happened: the broker
re-delivers the running job, the newer execution resumes from the checkpoint,
and the older one is fenced out at its next chunk. Needs Redis
(``EXAMPLE_REDIS_URL``). Exits 0 when every chunk was written exactly once and
a duplicate execution was fenced out.
"""

from __future__ import annotations

import json
import sys

from examples._support import delete_queues, delete_redis_keys, example_run, wait_until, workers

CHUNKS = 10


def main() -> int:
    with example_run("redelivery") as (namespace, tmp):
        from examples.redelivery import tasks

        data = tasks.client()
        try:
            with workers("examples.redelivery.tasks", ["w1", "w2"], queue=namespace, log_dir=tmp):
                tasks.export.delay("report-1", CHUNKS)
                wait_until(lambda: data.exists(tasks.done_key("report-1")), "the export to finish", timeout=120)
            story = [json.loads(line) for line in data.lrange(f"{namespace}:story", 0, -1)]
            chunks = data.hgetall(tasks.chunks_key("report-1"))
        finally:
            delete_redis_keys(tasks.REDIS_URL, f"{namespace}:*")
            delete_queues(tasks.app.conf.broker_url, namespace)
    start = story[0]["t"] if story else 0.0
    print(f"export of {CHUNKS} chunks (~{CHUNKS * tasks.CHUNK_SECONDS:g}s of work), acks_late, "
          f"visibility_timeout={tasks.VISIBILITY_TIMEOUT:g}s, 2 workers\n")  # fmt: skip
    for event in story:
        at = f"{event['t'] - start:5.1f}s  {event['worker']}  token {event['token']:<3}"
        if event["event"] == "start":
            if event["resume_from"] == 0:
                how = "starts"
            elif event.get("retry"):
                how = "runs a retry (deferred by a refused execution), resumes"
            else:
                how = "gets the re-delivered message, resumes"
            print(f"  {at} {how} at chunk {event['resume_from']}")
        elif event["event"] == "fenced_out":
            print(f"  {at} REFUSED writing chunk {event['chunk']} (mark {event['mark']}): stops, retry later")
        else:
            print(f"  {at} writes the last chunk: export done")
    starts = [e for e in story if e["event"] == "start"]
    fenced = [e for e in story if e["event"] == "fenced_out"]
    complete = sorted(chunks) == [f"chunk-{n:02d}" for n in range(CHUNKS)]
    print(f"\n  executions {len(starts)}, fenced out {len(fenced)}, chunks written {len(chunks)}/{CHUNKS}")
    ok = complete and len(starts) >= 2 and len(fenced) >= 1
    if ok:
        print(
            f"OK: the broker ran the job {len(starts)} times; each stale execution was fenced out at its next "
            "chunk, and every chunk was written once"
        )
    else:
        print("FAILED: expected a re-delivery fenced out and every chunk written once")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

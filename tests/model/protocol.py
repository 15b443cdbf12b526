"""An exhaustive model of fenced task execution with token blocks (issue 15): claims, writes, pauses, re-deliveries.

Why a model: with token *blocks* (a worker process reserves a block of tokens
with one coordinator write and hands them out in order), a token handed out
later in wall time, by another process, can be *lower* than one handed out
earlier. The library's safety never rested on wall-time order, only on the
storage's atomic compare; but one of its policies did: "a refused claim means a
newer execution exists, so drop this one" (``ignore``, the default for a task
fenced on its task id). This module explores every interleaving of a small
world and checks two properties in it, so that the change to blocks is shown
safe before it is made fast.

The world
---------
* A coordinator counter. Reserving a block is one write: block ``b`` holds the
  tokens ``b*K .. b*K+K-1``. ``K == 1`` is today's protocol (a token per task).
* Worker processes. Each holds at most one block and runs at most one
  execution. Any process may be slow at any point (a pause is an interleaving
  in which others act first), and may crash (its execution and its block are
  gone; it comes back empty).
* A broker with ``acks_late`` semantics. A delivered message stays unacked
  until its execution acks it; an unacked message may be delivered again: at
  once when its holder crashed, and (a bounded number of times) while its holder
  is merely slow, as a visibility timeout or a cut connection does. An ack
  does not recall a copy already put back in the queue (kombu's Redis
  transport behaves so), so a copy can arrive after its task is done.
* A store with a fence per resource (the mark: the highest token claimed or
  written) and, per task id, the exactly-once record ("applied by copy c").

An execution: take a message; mint a token; claim the task's resource (the mark
rises to the token unless it is above it); then the body's gated write, which
applies the task's effect and writes its record atomically, unless the token
is stale or the task is already applied. Between the claim and the write lies
the body: other processes may act there.

What an execution does on each answer (the protocol, :class:`Protocol`):
* claim or write finds the task applied: done, ack (exactly once);
* on a shared domain resource, a refusal retries (a new execution mints
  again), since the newer execution may belong to another task;
* on the task's own resource (its task id), a refusal means a newer copy of
  the task holds the resource. ``ignore_refused_claim`` (today's rule) acks
  and drops this copy. The fixed rule first re-mints *fresh* (a new block, so a
  token above every token minted before) when a refused claim's token came
  from an older block; then, refused still (or refused at a write), it
  *defers*: it publishes a retry of the task for later and acks. The retry
  finds the task applied and ends as done, or finds the newer copy dead and
  applies it.

The library (``FencedTask``, the ``defer`` policy) differs in two ways the
model leaves out: its retry comes back ``fencing_defer_countdown`` seconds
later (time is not modelled: a retry is just another message), and it defers
at most ``fencing_max_retries`` times per task id, then drops the copy as
``ignore`` does (here re-deliveries are bounded, so every chain of deferrals
ends by itself). The library's blocks (celery_fencing.blocks) are the model's
``block_size > 1``: ``mint_in_block`` is its MINT, ``mint_transient`` its
MINT_FRESH, and ``FencedTask._start_fencing`` re-mints fresh on a refused claim
of a block token, as :class:`Protocol` does; with ``block=1`` every token is
fresh and the re-mint step is the model's ``block_size=1`` case.

Why dropping loses a task even without blocks: the ack. kombu's Redis
transport keeps unacked messages by delivery tag, assigned at publish and kept
when a message is restored, so every delivery of one message shares it; the
dropped copy's ack removes the newer copy's entry too, and if the newer copy
then dies nothing brings the message back.

``Protocol.skip_claim`` lets the first delivery of a task fenced on its own
id go from its mint straight to its write, as the broker's ``redelivered``
flag tells it (``first``), or every delivery of the task's first message, for
a broker that never flags a re-delivery (``unflagged``). The library does
the former since issue 15 (``FencedTask._first_delivery``), which is the
latter on a broker without the flag; ``never`` is its
``fencing_claim_first_delivery=True``. The records at the write are what keeps
such a task applied once; the tests explore both.

The properties, checked in every reachable state:
* **at most once**: no task's effect is applied twice;
* **no task lost**: in every final state (nothing left to do: every message
  acked, every process idle) every task was applied exactly once.
States cut off by the bound on blocks are counted, never judged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Config", "Protocol", "Result", "explore"]

# Program counters of an execution.
MINT, MINT_FRESH, CLAIM, WRITE, ACK, DEFER = "mint", "mint-fresh", "claim", "write", "ack", "defer"
# Broker states of a task's message: AGAIN is READY after a delivery (the broker marks it redelivered).
READY, AGAIN, INFLIGHT, ACKED = "ready", "again", "in-flight", "acked"


@dataclass(frozen=True)
class Protocol:
    """The rules an execution follows; the defaults are the fixed protocol."""

    #: On a refused claim or write of a task-id resource: drop the copy at once (today's rule).
    ignore_refused_claim: bool = False
    #: Write and check exactly-once records (off: the control for "at most once").
    exactly_once: bool = True
    #: Which executions of a task fenced on its own id go from the mint straight to the write,
    #: without a claim: "never" (``fencing_claim_first_delivery``), "first" (the library's default:
    #: the first delivery of the task's first message, as the broker's redelivered flag tells it),
    #: "unflagged" (every delivery of the first message: a broker that never flags a re-delivery).
    skip_claim: str = "never"


@dataclass(frozen=True)
class Config:
    """The size of the world to explore."""

    #: Tokens per block (1: a coordinator write per token, today's protocol).
    block_size: int = 2
    processes: int = 2
    #: The resource of each task: its own (a task-id resource) unless named here.
    resources: tuple[str, ...] = ("t0", "t1")
    crashes: int = 1
    #: Re-deliveries of a message whose holder is alive (a pause past the visibility timeout).
    redeliveries: int = 1
    #: Blocks the coordinator may hand out in all: the bound of the search.
    max_blocks: int = 6

    @property
    def tasks(self) -> int:
        return len(self.resources)

    def own_resource(self, task: int) -> bool:
        """Whether *task* is fenced on its own id (not on a resource shared with other tasks)."""
        return self.resources.count(self.resources[task]) == 1


@dataclass
class Result:
    """What the search found: counts, and the shortest trace to each kind of violation."""

    states: int = 0
    final: int = 0
    cut_off: int = 0
    #: Shortest trace to a state where a task was applied twice (empty: none).
    applied_twice: list[str] = field(default_factory=list)
    #: Shortest trace to a final state where a task was never applied (empty: none).
    lost: list[str] = field(default_factory=list)


# State, as nested tuples (hashable, cheap to copy):
#   (blocks_handed_out, procs, marks, applied, effects, broker, copies, crashes_left, redeliveries_left)
#   proc       = (block, used, execution or None)
#   execution  = (task, message, copy, token, fresh, pc, skips_claim)
#   broker[t]  = the states of task t's messages, READY | INFLIGHT | ACKED, by delivery tag
#   copies[t]  = deliveries of task t so far (each delivery is an execution with its own id)
State = tuple


def initial(config: Config) -> State:
    names = sorted(set(config.resources))
    return (
        0,
        tuple((0, 0, None) for _ in range(config.processes)),
        tuple(0 for _ in names),
        tuple(-1 for _ in range(config.tasks)),
        tuple(0 for _ in range(config.tasks)),
        tuple((READY,) for _ in range(config.tasks)),
        tuple(0 for _ in range(config.tasks)),
        config.crashes,
        config.redeliveries,
    )


def _replace(tup: tuple, index: int, value: object) -> tuple:
    return (*tup[:index], value, *tup[index + 1 :])


def _set_message(broker: tuple, task: int, message: int, status: str) -> tuple:
    return _replace(broker, task, _replace(broker[task], message, status))


def successors(state: State, config: Config, protocol: Protocol) -> Iterator[tuple[str, State]]:
    """Every (action, next state) from *state*; a state that yields nothing is final or cut off."""
    blocks, procs, marks, applied, effects, broker, copies, crashes, redeliveries = state
    names = sorted(set(config.resources))
    k = config.block_size

    for p, (block, used, ex) in enumerate(procs):
        if ex is None:
            for t, messages in enumerate(broker):
                for m, status in enumerate(messages):
                    if status not in (READY, AGAIN):
                        continue
                    copy = copies[t] + 1
                    first = m == 0 and (status == READY or protocol.skip_claim == "unflagged")
                    skips = protocol.skip_claim != "never" and first and protocol.exactly_once
                    new_ex = (t, m, copy, 0, False, MINT, skips and config.own_resource(t))
                    yield (
                        f"p{p} takes task {t} (message {m}, execution {copy})",
                        (
                            blocks,
                            _replace(procs, p, (block, used, new_ex)),
                            marks,
                            applied,
                            effects,
                            _set_message(broker, t, m, INFLIGHT),
                            _replace(copies, t, copy),
                            crashes,
                            redeliveries,
                        ),
                    )
        else:
            yield from _step(state, config, protocol, p, names, k)
        if crashes and (ex is not None or block):
            yield (
                f"p{p} crashes",
                (
                    blocks,
                    _replace(procs, p, (0, 0, None)),
                    marks,
                    applied,
                    effects,
                    broker,
                    copies,
                    crashes - 1,
                    redeliveries,
                ),
            )

    for t, messages in enumerate(broker):
        for m, status in enumerate(messages):
            if status != INFLIGHT:
                continue
            held = any(ex is not None and ex[0] == t and ex[1] == m for _, _, ex in procs)
            again = _set_message(broker, t, m, AGAIN)
            if not held:
                # Its holder crashed: the visibility timeout (or the cut connection) brings it back.
                yield (
                    f"task {t} message {m} re-delivered (holder gone)",
                    (blocks, procs, marks, applied, effects, again, copies, crashes, redeliveries),
                )
            elif redeliveries:
                yield (
                    f"task {t} message {m} re-delivered while its holder is paused",
                    (blocks, procs, marks, applied, effects, again, copies, crashes, redeliveries - 1),
                )


def _step(
    state: State, config: Config, protocol: Protocol, p: int, names: list[str], k: int
) -> Iterator[tuple[str, State]]:
    """The next step of process *p*'s execution."""
    blocks, procs, marks, applied, effects, broker, copies, crashes, redeliveries = state
    block, used, ex = procs[p]
    task, message, copy, token, fresh, pc, skips_claim = ex
    r = names.index(config.resources[task])

    def moved(new_block: int, new_used: int, new_ex: tuple | None, **changes: object) -> State:
        return (
            changes.get("blocks", blocks),
            _replace(procs, p, (new_block, new_used, new_ex)),
            changes.get("marks", marks),
            changes.get("applied", applied),
            changes.get("effects", effects),
            changes.get("broker", broker),
            copies,
            crashes,
            redeliveries,
        )

    def to(pc_next: str, new_token: int = token, new_fresh: bool = fresh) -> tuple:
        return (task, message, copy, new_token, new_fresh, pc_next, skips_claim)

    if pc in (MINT, MINT_FRESH):
        # A first delivery that skips its claim goes from its mint to its write.
        after = WRITE if skips_claim and pc == MINT else CLAIM
        if pc == MINT and block and used < k:
            value = block * k + used
            yield f"p{p} mints {value} from its block {block}", moved(block, used + 1, to(after, value, False))
        elif blocks < config.max_blocks:
            # A new block: above every token minted before it, so a refusal of its token is news.
            new_block = blocks + 1
            value = new_block * k
            yield (
                f"p{p} reserves block {new_block}, mints {value}",
                moved(new_block, 1, to(after, value, True), blocks=new_block),
            )
        # else: the bound of the search; no successor, and the state is counted as cut off.
    elif pc == CLAIM:
        if protocol.exactly_once and applied[task] not in (-1, copy):
            yield f"p{p} claims {token}: task {task} already applied, done", moved(block, used, to(ACK))
        elif marks[r] > token:
            if not config.own_resource(task):
                action, nxt = "retry with a fresh token", MINT_FRESH  # the newer execution may be another task's
            elif protocol.ignore_refused_claim:
                action, nxt = "a newer execution exists: ignore", ACK
            elif not fresh:
                action, nxt = "re-mint fresh", MINT_FRESH
            else:
                action, nxt = "a newer execution exists: defer to it (retry later)", DEFER
            yield f"p{p} claims {token}: refused (mark {marks[r]}), {action}", moved(block, used, to(nxt))
        else:
            yield f"p{p} claims {token}", moved(block, used, to(WRITE), marks=_replace(marks, r, token))
    elif pc == WRITE:
        if protocol.exactly_once and applied[task] not in (-1, copy):
            yield f"p{p} writes {token}: task {task} already applied, done", moved(block, used, to(ACK))
        elif marks[r] > token:
            if not config.own_resource(task):
                # The retry policy: the task runs again, and mints again (from its block).
                yield f"p{p} writes {token}: stale (mark {marks[r]}), retry", moved(block, used, to(MINT, 0, False))
            elif protocol.ignore_refused_claim:
                yield (
                    f"p{p} writes {token}: stale (mark {marks[r]}), a newer execution exists: ignore",
                    moved(block, used, to(ACK)),
                )
            else:
                # Only a copy of this task claims its own resource: it is newer, and it may die.
                yield (
                    f"p{p} writes {token}: stale (mark {marks[r]}), defer to the newer copy (retry later)",
                    moved(block, used, to(DEFER)),
                )
        else:
            yield (
                f"p{p} writes {token}: task {task} applied",
                moved(
                    block,
                    used,
                    to(ACK),
                    marks=_replace(marks, r, token),
                    applied=_replace(applied, task, copy) if protocol.exactly_once else applied,
                    effects=_replace(effects, task, effects[task] + 1),
                ),
            )
    elif pc in (ACK, DEFER):
        # An ack removes the message from the unacked set by its delivery tag, which every
        # delivery of the message shares (kombu's Redis transport): it also drops the entry
        # of a copy running elsewhere. A copy already back in the queue stays there.
        acked = _set_message(broker, task, message, ACKED) if broker[task][message] == INFLIGHT else broker
        if pc == DEFER:
            # Celery's retry(countdown=...): a new message of the task, then the ack.
            acked = _replace(acked, task, (*acked[task], READY))
            yield f"p{p} publishes a retry of task {task} and acks", moved(block, used, None, broker=acked)
        else:
            yield f"p{p} acks task {task}", moved(block, used, None, broker=acked)


def explore(config: Config, protocol: Protocol = Protocol()) -> Result:
    """Breadth-first over every reachable state: shortest traces to violations come first."""
    start = initial(config)
    parents: dict[State, tuple[State | None, str]] = {start: (None, "start")}
    queue = deque([start])
    result = Result()

    def trace(state: State) -> list[str]:
        steps = []
        current: State | None = state
        while current is not None:
            parent, action = parents[current]
            steps.append(action)
            current = parent
        return steps[::-1]

    while queue:
        state = queue.popleft()
        result.states += 1
        effects, broker = state[4], state[5]
        if not result.applied_twice and any(count > 1 for count in effects):
            result.applied_twice = trace(state)
        moved = False
        for action, nxt in successors(state, config, protocol):
            moved = True
            if nxt not in parents:
                parents[nxt] = (state, action)
                queue.append(nxt)
        if moved:
            continue
        idle = all(ex is None for _, _, ex in state[1])
        if idle and all(status == ACKED for messages in broker for status in messages):
            result.final += 1
            if not result.lost and any(count == 0 for count in effects):
                result.lost = trace(state)
        else:
            result.cut_off += 1
    return result


#: The deeper worlds of ``python -m tests.model.protocol``: more crashes, re-deliveries, processes.
DEEP = (
    Config(block_size=2, crashes=2),
    Config(block_size=2, redeliveries=2),
    Config(block_size=2, processes=3, max_blocks=5),
    Config(block_size=3, max_blocks=5, resources=("acct", "acct")),
)


def main() -> int:
    """Explore the deeper worlds with the fixed protocol and print a line each; 1 if any violation."""
    import time

    failed = False
    for config in DEEP:
        started = time.monotonic()
        result = explore(config, Protocol())
        bad = bool(result.lost or result.applied_twice)
        failed |= bad
        print(
            f"{config}: {result.states} states, {result.final} final, {result.cut_off} cut off, "
            f"lost {'yes' if result.lost else 'no'}, applied twice {'yes' if result.applied_twice else 'no'}, "
            f"{time.monotonic() - started:.1f} s",
            flush=True,
        )
        for trace in (result.lost, result.applied_twice):
            if trace:
                print("   " + " | ".join(trace))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

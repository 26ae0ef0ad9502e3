"""Timed-message load benchmark for any chronoq broker (issue 2, section 5).

Shape of Tencent's TDMQ delay-message test, scaled to one small machine. It uses
only the ``BrokerAdapter`` contract, so ``--broker URL`` measures any adapter; by
default it opens a fresh ``rocksdb://`` directory under the temp dir and removes it
afterwards (``--keep`` keeps it). Topics and groups are named per run
(``bench.load.<pid>-<time>``), so a shared broker is not disturbed by old runs.

Run from the project root (``/work/main``)::

    .venv/bin/python bench/timer_load.py                      # load: 200,000 due 5-35 s
    .venv/bin/python bench/timer_load.py --rate 10000         # 300,000 due 5-35 s
    .venv/bin/python bench/timer_load.py --rate 30000         # 900,000 due 5-35 s
    .venv/bin/python bench/timer_load.py -n 20000 --due-from 2 --due-to 6
    .venv/bin/python bench/timer_load.py --burst              # 500,000 due in one second
    .venv/bin/python bench/timer_load.py --pending 1000000    # also 10000000
    .venv/bin/python bench/timer_load.py --broker rocksdb:///tmp/q --json

Every mode prints a labelled block; ``--json`` adds one JSON line of the figures.
The exit status is 1 when a message was lost (or is missing after the reopen), an
aborted one was delivered, or an unknown one received; duplicates are reported.
Progress goes to stderr (``--quiet`` silences it). A watchdog ends the process
if a run overstays ``--max-seconds`` (default: derived from the run's size).

Figures, mode ``load`` (the default)
    send single
        ``--single`` messages (default 50,000) sent with one ``send`` each from the
        ``-p`` producer threads, to a separate topic ``bench.single.<run>``, due one
        day later: they never fire during the run, are not counted in lateness, and
        are aborted at the end (that gives the *abort* rate). msgs/s of wall time.
    send batched
        the N timed messages sent with ``send_batch`` (``--batch``, default 1,000)
        from ``-p`` threads (default 2), msgs/s of wall time. Both send figures
        include building the ``Message`` objects, as a producer would.
    aborted
        right after the batched sends, ``--abort-frac`` (default 1 %) of the accepted
        ids, chosen at random, are aborted by ``msg_id``.
    fire rate
        nominal: expected messages / due window; measured: deliveries / (last
        receipt - first receipt); peak: the fullest one-second bin of receipts.
    lateness
        per delivery, ``time.time()`` in ms when the consumer's ``pull`` returned
        minus the message's ``deliver_at_ms``; nearest-rank P50/P90/P99/P99.9 and max.
        One group, ``-c`` consumer threads (default 1), ``pull(256, wait_ms=100)``,
        each pulled batch acked (``ack_batch``) right after the clock is read.
    lost
        accepted (``SendStatus.OK``), not aborted, and never received before the
        deadline: last due time + ``--grace`` (default 10 s). The run ends earlier
        once every expected id has arrived and ``--settle`` (1 s) has passed since the
        last due time (so a wrongly fired aborted message would still be seen).
    duplicated
        deliveries beyond the first of a ``msg_id``.
    aborted delivered
        ids whose abort answered ``ABORTED`` and that were received anyway. Must be 0.
    unexpected
        received ids this run never had accepted. Must be 0.
    pending at peak
        the largest ``stats()`` pending count seen (sampled every ``--stats-interval``
        s, first right after the sends), for the load topic and for all topics.
    RSS
        this process (broker included when embedded): ``VmRSS`` before the broker
        opened and ``VmHWM`` (peak) at the end, from ``/proc/self/status`` (not
        ``ru_maxrss``). The peak includes this script's own bookkeeping (the sets of
        ids and the lateness arrays), whose size is estimated and printed beside it.
    CPU
        user + system seconds of this process during the run, and per message.

``--rate R``: N = R x (``--due-to`` - ``--due-from``), so the timed messages fire at
about R/s (the targets are stated at 10,000 and 30,000 fires/s). When sending a
large N takes longer than ``--due-from``, the block warns that sending overlapped
firing; then move the window later, e.g. ``--rate 30000 --due-from 20 --due-to 50``.

Mode ``--burst [N]`` (default 500,000)
    All N due within one calendar second T (``--burst-at`` s after start, default
    10; uniformly over its 1,000 ms), sent in advance in batches; the same consumer,
    abort and accounting as ``load``. Prints the time from T until the last message
    was received, how many arrived by T + 1 s and T + 3 s, and the lateness.

Mode ``--pending [N]`` (default 1,000,000)
    Fills N messages due one day later (spread over an hour), batch default 10,000,
    without collecting ids. Prints the fill rate and RSS after the fill (``VmRSS``
    after ``--settle`` s, and ``VmHWM``); then closes the broker and starts a fresh
    subprocess (so the parent's memory does not pollute the figure) that times
    ``open_broker`` (reopen), sends one message due now and times until ``pull``
    returns it (first fire), checks ``stats().pending`` against N, and reports its
    own ``VmRSS``/``VmHWM`` after reopen. On a ``--broker`` you pass, the N messages
    stay there.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from itertools import chain

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.loadgen import (
    DAY_MS,
    HOUR_MS,
    ConsumerThread,
    Figures,
    SendPhase,
    abort_phase,
    account,
    all_received,
    bookkeeping_bytes,
    log,
    now_ms,
    pick,
    receipts,
    send_phase,
    start_consumers,
    stop_consumers,
)
from bench.pending import print_pending, run_pending, run_probe
from bench.stats import (
    cpu_seconds,
    format_percentiles,
    mb,
    num,
    peak_rss_bytes,
    percentiles,
    print_block,
    rss_bytes,
)
from broker_adapter import BrokerAdapter, open_broker


class Monitor:
    """Samples ``stats()`` and waits until every expected id arrived or the deadline."""

    def __init__(self, broker: BrokerAdapter, topic: str, args: argparse.Namespace) -> None:
        self.broker, self.topic, self.args = broker, topic, args
        self.peak_topic: int | None = None
        self.peak_total: int | None = None
        self.stats_error: str | None = None

    def sample(self) -> None:
        if self.stats_error is not None:
            return
        try:
            s = self.broker.stats()
        except Exception as e:  # noqa: BLE001 - an adapter without stats still benches
            self.stats_error = f"{type(e).__name__}: {e}"
            return
        t = s.topics.get(self.topic)
        self.peak_topic = max(self.peak_topic or 0, t.pending if t else 0)
        self.peak_total = max(self.peak_total or 0, s.pending)

    def wait(
        self,
        consumers: Sequence[ConsumerThread],
        stop: threading.Event,
        expected: set[str],
        last_due_ms: float,
    ) -> bool:
        """Block until all expected ids arrived (and ``--settle`` passed the last due
        time) or until last due + ``--grace``; ``True`` when complete."""
        args = self.args
        settle_at = last_due_ms + args.settle * 1000
        deadline = last_due_ms + args.grace * 1000
        next_stats = next_check = 0.0
        next_log = time.monotonic() + 5
        while not stop.is_set():
            now = now_ms()
            if now >= next_stats:
                self.sample()
                next_stats = now + args.stats_interval * 1000
            if now >= settle_at and now >= next_check:
                if all_received(expected, consumers):
                    return True
                next_check = now + 1000
            if now >= deadline:
                return False
            if time.monotonic() >= next_log:
                got = sum(c.count for c in consumers)
                log(args, f"received {num(got)} / {num(len(expected))}")
                next_log += 5
            time.sleep(0.05)
        return False


def timed_run(
    args: argparse.Namespace, url: str, mode: str, n: int, lo_ms_rel: int, hi_ms_rel: int
) -> Figures:
    """Shared body of ``load`` and ``burst``: send, abort, consume, account.

    Due times are ``start + [lo_ms_rel, hi_ms_rel)`` where ``start`` is when the
    batched sends begin (``burst`` passes absolute offsets via ``args.burst_t_ms``).
    """
    run = args.run_id
    topic, group = f"bench.{mode}.{run}", f"bench-{mode}-{run}"
    body = b"x" * args.body_size
    fig: Figures = {
        "mode": mode,
        "broker": url,
        "n": n,
        "producers": args.producers,
        "consumers": args.consumers,
        "batch": args.batch,
        "body_bytes": args.body_size,
    }
    rss0, cpu0 = rss_bytes(), cpu_seconds()
    t = time.perf_counter()
    broker = open_broker(url)
    fig["open_ms"] = (time.perf_counter() - t) * 1000
    stop = threading.Event()
    single: SendPhase | None = None
    monitor = Monitor(broker, topic, args)
    consumers: list[ConsumerThread] = []
    try:
        consumers = start_consumers(broker, group, topic, args, stop)
        if mode == "load" and args.single > 0:
            far = int(now_ms()) + DAY_MS
            log(args, f"single sends: {num(args.single)} to bench.single.{run}")
            single = send_phase(
                broker,
                f"bench.single.{run}",
                args.single,
                far,
                far + HOUR_MS,
                threads=args.producers,
                batch=1,
                body=body,
                seed=args.seed + 7,
            )
        start = int(now_ms())
        if mode == "burst":
            lo, hi = args.burst_t_ms, args.burst_t_ms + 1000
        else:
            lo, hi = start + lo_ms_rel, start + hi_ms_rel
        log(args, f"batched sends: {num(n)} to {topic}")
        phase = send_phase(
            broker,
            topic,
            n,
            lo,
            hi,
            threads=args.producers,
            batch=args.batch,
            body=body,
            seed=args.seed,
        )
        sends_done = now_ms()
        aborts = abort_phase(broker, pick(phase.ids, args.abort_frac, args.seed + 1))
        aborts_done = now_ms()
        monitor.sample()
        accepted = set(chain.from_iterable(phase.ids))
        expected = accepted - aborts.aborted
        # The script's own bookkeeping (ids, Message objects) is large; freeze it so
        # the collector's full passes over it don't show up as broker lateness.
        gc.collect()
        gc.freeze()
        log(args, f"sent; waiting for {num(len(expected))} deliveries")
        complete = monitor.wait(consumers, stop, expected, phase.max_due_ms)
    finally:
        stop_consumers(consumers, stop)
        try:
            if single is not None:
                cleanup = abort_phase(broker, single.ids)
                fig["abort_cleanup_rate"] = cleanup.rate
                fig["abort_cleanup"] = dict(cleanup.statuses)
        finally:
            broker.close()
    cpu = cpu_seconds() - cpu0
    acc = account(accepted, aborts.aborted, consumers)
    lat = percentiles(chain.from_iterable(c.lateness for c in consumers))
    recv = receipts(consumers)
    fig.update(
        send_single_rate=single.rate if single else None,
        send_single_n=single.sent if single else 0,
        send_batched_rate=phase.rate,
        send_batched_s=phase.elapsed_s,
        send_not_ok=dict(phase.not_ok),
        sends_done_before_first_due_ms=lo - aborts_done,
        abort_rate=aborts.rate,
        aborts=dict(aborts.statuses),
        complete=complete,
        expected=acc.expected,
        received=acc.received,
        lost=acc.lost,
        duplicated=acc.duplicated,
        aborted_delivered=acc.aborted_delivered,
        unexpected=acc.unexpected,
        lateness_ms=lat,
        pending_peak_topic=monitor.peak_topic,
        pending_peak_total=monitor.peak_total,
        stats_error=monitor.stats_error,
        rss_before_open_bytes=rss0,
        peak_rss_bytes=peak_rss_bytes(),
        bookkeeping_bytes=bookkeeping_bytes(accepted, phase, consumers),
        cpu_s=cpu,
        cpu_us_per_msg=cpu / max(1, n + (single.sent if single else 0)) * 1e6,
        due_window_ms=(lo - start, hi - start),
        sends_s_after_start=(sends_done - start) / 1000,
    )
    if recv:
        first, last = recv[0][0], recv[-1][0]
        bins: dict[int, int] = {}
        for t_ms, k in recv:
            bins[int(t_ms // 1000)] = bins.get(int(t_ms // 1000), 0) + k
        fig["fire_rate_nominal"] = acc.expected / max(0.001, (hi - lo) / 1000)
        fig["fire_rate_measured"] = acc.received / max(0.001, (last - first) / 1000)
        fig["fire_rate_peak_1s"] = max(bins.values())
        if mode == "burst":
            t_burst = args.burst_t_ms
            fig["burst_last_after_ms"] = last - t_burst
            fig["burst_by_1s"] = sum(k for t_ms, k in recv if t_ms <= t_burst + 1000)
            fig["burst_by_3s"] = sum(k for t_ms, k in recv if t_ms <= t_burst + 3000)
    return fig


def print_timed(fig: Figures) -> None:
    """The summary block of ``load`` and ``burst``."""
    lo, hi = fig["due_window_ms"]
    lat, n = fig["lateness_ms"], num(fig["n"])
    if fig["mode"] == "burst":
        what = f"{n} due within one second, {lo / 1000:.1f} s after the sends began"
    else:
        what = f"{n} due uniformly {lo / 1000:.1f}-{hi / 1000:.1f} s after start"
    setup = f"{fig['producers']} producer threads, batch {num(fig['batch'])}, "
    setup += f"body {fig['body_bytes']} B, {fig['consumers']} consumer thread(s)"
    batched = f"{num(fig['send_batched_rate'])} msgs/s ({n} in {fig['send_batched_s']:.2f} s"
    batched += f"; not OK: {fig['send_not_ok']})" if fig["send_not_ok"] else ")"
    aborts = f"{fig['aborts']} at {num(fig['abort_rate'])}/s"
    if "abort_cleanup_rate" in fig:
        aborts += f"; cleanup of the single sends {num(fig['abort_cleanup_rate'])}/s"
    margin = fig["sends_done_before_first_due_ms"] / 1000
    done = f"{margin:.2f} s before the first due time"
    done += "  WARNING: sending overlapped firing" if margin < 0 else ""
    lost = f"{num(fig['lost'])} of {num(fig['expected'])} expected"
    lost += "" if fig["complete"] else "  (stopped at the deadline: last due + grace)"
    if fig["stats_error"]:
        pending = f"stats() failed: {fig['stats_error']}"
    else:
        pending = f"{num(fig['pending_peak_topic'] or 0)} (this topic), "
        pending += f"{num(fig['pending_peak_total'] or 0)} (all topics)"
    rss = f"{mb(fig['rss_before_open_bytes'])} before open; peak (VmHWM) "
    rss += f"{mb(fig['peak_rss_bytes'])}, of which ~{mb(fig['bookkeeping_bytes'])} "
    rss += "is this script's id/lateness bookkeeping"
    rows = [("broker", fig["broker"]), ("messages", what), ("setup", setup)]
    if fig["send_single_rate"] is not None:
        single = f"{num(fig['send_single_rate'])} msgs/s ({num(fig['send_single_n'])} one by one,"
        rows.append(("send single", single + " separate topic due in 1 day, not in lateness)"))
    rows += [("send batched", batched), ("aborts", aborts), ("sends+aborts done", done)]
    if "fire_rate_nominal" in fig:
        rate = f"{num(fig['fire_rate_nominal'])}/s nominal, "
        rate += f"{num(fig['fire_rate_measured'])}/s measured, "
        rate += f"{num(fig['fire_rate_peak_1s'])}/s peak 1-s bin"
        rows.append(("fire rate", rate))
    if "burst_last_after_ms" in fig:
        burst = f"last received {fig['burst_last_after_ms'] / 1000:.2f} s after the second began;"
        burst += f" received by +1 s {num(fig['burst_by_1s'])}, by +3 s {num(fig['burst_by_3s'])}"
        rows.append(("burst drained", burst))
    rows += [
        ("lateness ms", f"{format_percentiles(lat)}  ({num(lat['count'] or 0)} deliveries)"),
        ("lost", lost),
        ("duplicated", num(fig["duplicated"])),
        ("aborted delivered", num(fig["aborted_delivered"])),
        ("unexpected", num(fig["unexpected"])),
        ("pending at peak", pending),
        ("RSS", rss),
        ("CPU", f"{fig['cpu_s']:.1f} s (user+sys) = {fig['cpu_us_per_msg']:.1f} us/msg"),
    ]
    print_block(f"chronoq timer_load: {fig['mode']}", rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Timed-message load benchmark (see the module docstring for each figure).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--broker", help="broker URL (default: a fresh temp rocksdb:// dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp broker dir")
    p.add_argument("--tmp-dir", help="where the temp broker dir is made")
    p.add_argument("--json", action="store_true", help="also print one JSON line of figures")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--burst",
        type=int,
        nargs="?",
        const=500_000,
        metavar="N",
        help="burst mode: N due in the same second",
    )
    mode.add_argument(
        "--pending",
        type=int,
        nargs="?",
        const=1_000_000,
        metavar="N",
        help="pending mode: N due in 1 day; RSS, reopen, first fire",
    )
    mode.add_argument(
        "--rate", type=int, metavar="R", help="load mode with N = R x window, i.e. ~R fires/s"
    )
    p.add_argument("-n", type=int, default=200_000, help="load mode: timed messages")
    p.add_argument("--due-from", type=float, default=5.0, help="load: window start, s after start")
    p.add_argument("--due-to", type=float, default=35.0, help="load: window end, s after start")
    p.add_argument("--single", type=int, default=50_000, help="load: messages sent one by one")
    p.add_argument("--burst-at", type=int, default=10, help="burst: the second, s after start")
    p.add_argument("-p", "--producers", type=int, default=2, help="producer threads")
    p.add_argument("-c", "--consumers", type=int, default=1, help="consumer threads (one group)")
    p.add_argument("--batch", type=int, help="send_batch size (default 1000; pending 10000)")
    p.add_argument("--body-size", type=int, default=100, help="body bytes per message")
    p.add_argument("--abort-frac", type=float, default=0.01, help="fraction aborted by id")
    p.add_argument("--pull-max", type=int, default=256, help="pull(max_messages)")
    p.add_argument("--pull-wait-ms", type=int, default=100, help="pull(wait_ms)")
    p.add_argument("--max-inflight", type=int, default=1000, help="consumer max_inflight")
    p.add_argument(
        "--ack-each",
        action="store_true",
        help="ack each message on its own (default: one ack_batch per pull)",
    )
    p.add_argument("--grace", type=float, default=10.0, help="s after the last due time to wait")
    p.add_argument("--settle", type=float, default=1.0, help="s to wait before final checks")
    p.add_argument("--stats-interval", type=float, default=1.0, help="s between stats() samples")
    p.add_argument("--seed", type=int, default=1, help="random seed")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=0.0,
        help="watchdog: kill the run after this long (0: derived from its size)",
    )
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--probe-topic", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.batch is None:
        args.batch = 10_000 if args.pending is not None else 1_000
    if args.due_to <= args.due_from:
        p.error("--due-to must be after --due-from")
    for name in ("n", "batch", "producers", "consumers", "pull_max"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.abort_frac < 1:
        p.error("--abort-frac must be in [0, 1)")
    args.run_id = args.run_id or f"{os.getpid()}-{int(time.time())}"
    return args


def start_watchdog(args: argparse.Namespace, limit_s: float, cleanup: str | None) -> None:
    def expire() -> None:
        print(
            f"timer_load: watchdog: still running after {limit_s:.0f} s, exiting",
            file=sys.stderr,
            flush=True,
        )
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
        os._exit(3)

    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.t0 = time.perf_counter()
    if args.probe:
        run_probe(args)
        return 0
    temp_dir = None
    if args.broker:
        url = args.broker
    else:
        temp_dir = tempfile.mkdtemp(prefix="chronoq-bench-", dir=args.tmp_dir)
        url = f"rocksdb://{temp_dir}"
    if args.pending is not None:
        n = args.pending
        limit = 180 + n / 15_000
    elif args.burst is not None:
        n = args.burst
        limit = 180 + args.burst_at + args.grace + n / 15_000
    else:
        n = args.n if args.rate is None else int(args.rate * (args.due_to - args.due_from))
        limit = 180 + args.due_to + args.grace + (n + args.single) / 15_000
    start_watchdog(args, args.max_seconds or limit, None if args.keep else temp_dir)
    try:
        if args.pending is not None:
            fig = run_pending(args, url, n)
            print_pending(fig)
        else:
            if args.burst is not None:
                args.burst_t_ms = (int(now_ms()) // 1000 + args.burst_at) * 1000
                fig = timed_run(args, url, "burst", n, 0, 0)
            else:
                fig = timed_run(
                    args, url, "load", n, int(args.due_from * 1000), int(args.due_to * 1000)
                )
            print_timed(fig)
        if temp_dir:
            fig["broker_dir_kept"] = args.keep
        if args.json:
            print(json.dumps(fig, default=str))
    finally:
        if temp_dir and not args.keep:
            shutil.rmtree(temp_dir, ignore_errors=True)
    missing = (
        fig["accepted"] - (fig["reopen"].get("pending_after_reopen") or 0) if "reopen" in fig else 0
    )
    bad = fig.get("lost") or fig.get("aborted_delivered") or fig.get("unexpected") or missing
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

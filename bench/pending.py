"""``--pending`` mode of ``timer_load``: fill far-future messages, measure RSS, reopen.

The reopen runs in a fresh subprocess (``timer_load.py --probe URL``) so that its
memory figures are its own: ``VmHWM`` of a process is its own peak, and a
subprocess started from a large parent does not inherit it (``ru_maxrss`` would).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.loadgen import DAY_MS, HOUR_MS, Figures, log, now_ms, send_phase
from bench.stats import dir_bytes, mb, ms, num, print_block, proc_status, rss_bytes
from broker_adapter import Message, open_broker
from broker_adapter.urls import split_url

#: The script the probe subprocess runs.
TIMER_LOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timer_load.py")


def run_pending(args: argparse.Namespace, url: str, n: int) -> Figures:
    """Fill ``n`` far-future messages, measure RSS, close, reopen in a fresh process."""
    run = args.run_id
    topic = f"bench.pending.{run}"
    fig: Figures = {
        "mode": "pending",
        "broker": url,
        "n": n,
        "producers": args.producers,
        "batch": args.batch,
        "body_bytes": args.body_size,
    }
    fig["rss_before_open_bytes"] = rss_bytes()
    t = time.perf_counter()
    broker = open_broker(url)
    fig["open_ms"] = (time.perf_counter() - t) * 1000
    try:
        far = int(now_ms()) + DAY_MS
        log(args, f"filling {num(n)} due in 1 day")
        phase = send_phase(
            broker,
            topic,
            n,
            far,
            far + HOUR_MS,
            threads=args.producers,
            batch=args.batch,
            body=b"x" * args.body_size,
            seed=args.seed,
            collect_ids=False,
        )
        fig.update(fill_rate=phase.rate, fill_s=phase.elapsed_s, accepted=phase.accepted)
        time.sleep(args.settle)
        status = proc_status()
        fig["rss_after_fill_bytes"] = status.get("VmRSS", 0)
        fig["peak_rss_fill_bytes"] = status.get("VmHWM", 0)
        try:
            s = broker.stats()
            t_stats = s.topics.get(topic)
            fig["pending_after_fill"] = t_stats.pending if t_stats else 0
        except Exception as e:  # noqa: BLE001
            fig["pending_after_fill"] = None
            fig["stats_error"] = f"{type(e).__name__}: {e}"
    finally:
        t = time.perf_counter()
        broker.close()
        fig["close_ms"] = (time.perf_counter() - t) * 1000
    path = rocksdb_path(url)
    if path:
        fig["disk_bytes"] = dir_bytes(path)
    log(args, "reopening in a fresh subprocess")
    cmd = [
        sys.executable,
        TIMER_LOAD,
        "--probe",
        url,
        "--probe-topic",
        topic,
        "--settle",
        str(args.settle),
        "--run-id",
        run,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"reopen probe failed ({proc.returncode}): {proc.stderr[-2000:]}")
    fig["reopen"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return fig


def run_probe(args: argparse.Namespace) -> None:
    """In a fresh process: reopen, first fire, pending count, own RSS; one JSON line."""
    rss_start = rss_bytes()
    t0 = time.perf_counter()
    broker = open_broker(args.probe)
    t_open = time.perf_counter()
    out: Figures = {"rss_before_open_bytes": rss_start, "reopen_ms": (t_open - t0) * 1000}
    with broker:
        topic = f"bench.probe.{args.run_id}"
        with broker.consumer(f"bench-probe-{args.run_id}", [topic]) as consumer:
            t_send = time.perf_counter()
            broker.send(Message(topic, b"probe"))
            got = []
            while not got and time.perf_counter() - t_send < 30:
                got = consumer.pull(1, 200)
            t_fire = time.perf_counter()
            out["first_fire_ms"] = (t_fire - t_send) * 1000 if got else None
            out["reopen_to_first_fire_ms"] = (t_fire - t0) * 1000 if got else None
            for m in got:
                consumer.ack(m)
        try:
            s = broker.stats()
            t_stats = s.topics.get(args.probe_topic)
            out["pending_after_reopen"] = t_stats.pending if t_stats else 0
        except Exception as e:  # noqa: BLE001
            out["pending_after_reopen"] = None
            out["stats_error"] = f"{type(e).__name__}: {e}"
        time.sleep(args.settle)
        status = proc_status()
        out["rss_after_reopen_bytes"] = status.get("VmRSS", 0)
        out["peak_rss_bytes"] = status.get("VmHWM", 0)
        t_close = time.perf_counter()
    out["close_ms"] = (time.perf_counter() - t_close) * 1000
    print(json.dumps(out))


def print_pending(fig: Figures) -> None:
    """The summary block of ``pending``."""
    r = fig["reopen"]
    what = f"{num(fig['n'])} due in 1 day (over 1 h), {fig['producers']} producer threads, "
    what += f"batch {num(fig['batch'])}, body {fig['body_bytes']} B"
    fill = f"{num(fig['fill_rate'])} msgs/s ({fig['fill_s']:.1f} s), "
    fill += f"accepted {num(fig['accepted'])}"
    pend = fig.get("pending_after_fill")
    rss = f"{mb(fig['rss_after_fill_bytes'])} (VmRSS); peak {mb(fig['peak_rss_fill_bytes'])} "
    rss += f"(VmHWM); {mb(fig['rss_before_open_bytes'])} before open"
    fire = f"{ms(r['first_fire_ms'])} ms send->pull; "
    fire += f"{ms(r['reopen_to_first_fire_ms'])} ms from reopen start"
    pr = r.get("pending_after_reopen")
    reopened = "-" if pr is None else f"{num(pr)} (missing: {num(fig['accepted'] - pr)})"
    rss2 = f"{mb(r['rss_after_reopen_bytes'])} (VmRSS); peak {mb(r['peak_rss_bytes'])} "
    rss2 += f"(VmHWM) of the fresh process; {mb(r['rss_before_open_bytes'])} before open"
    rows = [
        ("broker", fig["broker"]),
        ("messages", what),
        ("fill", fill),
        ("pending after fill", "-" if pend is None else num(pend)),
        ("RSS after fill", rss),
        ("close", f"{ms(fig['close_ms'])} ms"),
    ]
    if "disk_bytes" in fig:
        rows.append(("disk after close", mb(fig["disk_bytes"])))
    rows += [
        ("reopen (fresh proc)", f"{ms(r['reopen_ms'])} ms open_broker"),
        ("first fire", fire),
        ("pending after reopen", reopened),
        ("RSS after reopen", rss2),
    ]
    print_block("chronoq timer_load: pending", rows)


def rocksdb_path(url: str) -> str | None:
    """The directory of a ``rocksdb://`` URL, else ``None``."""
    scheme, rest, _ = split_url(url)
    return rest if scheme == "rocksdb" else None

"""What metrics cost on the hot path (issue 15: within 3 %): two brokers side by side, one with
``--metrics-listen`` and scraped every ``--scrape-interval`` seconds, one without, driven in
alternating rounds through the SDK so the machine's drift hits both alike. Per round and broker:
produce 100 B batches of 1000, consume them (every message's topic, tag, keys and body read),
and time single sends.

Prints one JSON line: medians per broker (``*_off``, ``*_on``) and ``on / off`` ratios
(``produce_ratio``, ``consume_ratio``; ``send_p50_ratio`` is on/off latency, so above 1 is slower).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench_e2e import Scraper, _consume, _latency, _metrics_args, _produce, _run, _start_broker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="produce time per round and broker")
    parser.add_argument("--sends", type=int, default=5000, help="single sends timed per round and broker")
    parser.add_argument("--scrape-interval", type=float, default=5.0)
    args = parser.parse_args()
    from gms.client import Admin
    figures: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    with tempfile.TemporaryDirectory() as tmp:
        metrics_args, metrics_port = _metrics_args(True)
        brokers = {"off": _start_broker(Path(tmp) / "off"), "on": _start_broker(Path(tmp) / "on", *metrics_args)}
        scraper = Scraper(metrics_port, args.scrape_interval)
        scraper.start()
        try:
            for _, address in brokers.values():
                with Admin([address]) as admin:
                    admin.create_topic("lat", queues=8)
                    for rnd in range(args.rounds + 1):  # a topic per round: each consumes only its own
                        admin.create_topic(f"b100-{rnd}", queues=8)
            for rnd in range(args.rounds + 1):  # round 0 warms both brokers' files up, uncounted
                order = ["off", "on"] if rnd % 2 == 0 else ["on", "off"]
                for name in order:
                    address = brokers[name][1]
                    sent, elapsed = _run(_produce, address, f"b100-{rnd}", 100, args.seconds)
                    got, consume_s = _run(_consume, address, f"b100-{rnd}", sent, 100)
                    p50, p99 = _run(_latency, address, "lat", args.sends)
                    if rnd == 0:
                        continue
                    for key, value in (("produce", sent / elapsed), ("consume", got / consume_s),
                                       ("send_p50_us", p50), ("send_p99_us", p99)):
                        figures[name].setdefault(key, []).append(value)
        finally:
            scraper.stop.set()
            for proc, _ in brokers.values():
                proc.terminate()
                proc.wait()
    result: dict[str, float | int] = {"rounds": args.rounds, "scrapes": scraper.scrapes}
    for name, keys in figures.items():
        for key, values in keys.items():
            result[f"{key}_{name}"] = round(statistics.median(values), 1)
    for key in ("produce", "consume", "send_p50_us", "send_p99_us"):
        result[f"{key.removesuffix('_us')}_ratio"] = round(result[f"{key}_on"] / result[f"{key}_off"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

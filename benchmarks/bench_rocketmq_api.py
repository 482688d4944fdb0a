"""The official RocketMQ 5 client (``rocketmq-python-client``) against gms's RocketMQ gRPC API,
side by side with gms's own SDK doing the same work against the same broker process.

Workloads (100 B messages, a 4-queue topic, one broker process, everything on 127.0.0.1):
- ``send``: one synchronous send at a time (each waits for its acknowledgement);
- ``async``: sends pipelined, at most ``WINDOW`` unacknowledged;
- ``consume``: a simple (pop) consumer receiving up to 32 at a time, reading every body and
  acknowledging every message (the RocketMQ client acknowledges one message per call; gms's
  ``SimpleConsumer.ack`` takes the batch).

For each, the rate the application sees and the broker's CPU time per message (user + system,
from /proc). ``*_server_cpu_ratio`` is the gRPC path's broker CPU per message over the native
path's: issue 17's target is ≤ 2. ``empty_rpc_server_cpu_us`` is the floor under every RocketMQ
call: the broker's CPU for one ``Heartbeat`` (a handler that does nothing) sent with the metadata the
official client sends, one at a time; ``empty_rpc_over_native_send`` divides it by a whole native
send's. Prints one JSON line. ``--quick`` runs small counts.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from bench_procs import start_server, stop_servers

BODY = b"x" * 100
TOPIC = "rmq-bench"
WINDOW = 256
RECEIVE_MAX = 32


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (fields 14-15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_idle(pid: int, timeout_s: float = 120.0) -> None:
    """Until the broker is done preallocating its first files (its CPU under 5 % for 0.5 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cpu = _cpu_s(pid)
        time.sleep(0.5)
        if _cpu_s(pid) - cpu < 0.025:
            return


def _measured(pid: int, count: int, work: Callable[[], None]) -> tuple[float, float]:
    """(messages/s, broker CPU µs per message) of ``work`` handling ``count`` messages."""
    started, cpu = time.perf_counter(), _cpu_s(pid)
    work()
    elapsed = time.perf_counter() - started
    return count / elapsed, (_cpu_s(pid) - cpu) * 1e6 / count


def _pipelined(send: Callable[[int], Future], count: int) -> None:
    pending: list[Future] = []
    for i in range(count):
        pending.append(send(i))
        if len(pending) >= WINDOW:
            for future in pending[: WINDOW // 2]:
                future.result()
            del pending[: WINDOW // 2]
    for future in pending:
        future.result()


class RocketMQSide:
    """The official client's producer and simple consumer."""

    def __init__(self, endpoint: str) -> None:
        import rocketmq
        self.rocketmq = rocketmq
        self.config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(), request_timeout=10)
        self.producer = rocketmq.Producer(self.config, (TOPIC,))
        self.producer.startup()
        self.consumer = rocketmq.SimpleConsumer(self.config, "bench-rmq", {TOPIC: rocketmq.FilterExpression("*")},
                                               await_duration=2)
        self.consumer.startup()

    def _message(self):
        message = self.rocketmq.Message()
        message.topic, message.body, message.tag = TOPIC, BODY, "T"
        return message

    def send(self, count: int) -> None:
        for _ in range(count):
            self.producer.send(self._message())

    def send_async(self, count: int) -> None:
        _pipelined(lambda i: self.producer.send_async(self._message()), count)

    def consume(self, count: int) -> None:
        got = 0
        while got < count:
            for message in self.consumer.receive(RECEIVE_MAX, 30):
                message.body  # noqa: B018 - read as an application does
                self.consumer.ack(message)
                got += 1

    def close(self) -> None:
        self.producer.shutdown()
        self.consumer.shutdown()


def empty_rpcs(endpoint: str, count: int) -> None:
    """``count`` Heartbeat calls through a bare stub, each with the official client's headers."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc
    metadata = [("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"), ("x-mq-client-version", "5.1.2"),
                ("x-mq-date-time", "20261126T120000Z"), ("x-mq-request-id", "0" * 36),
                ("x-mq-client-id", "bench@1@0@empty"), ("x-mq-namespace", "")]
    request = service_pb2.HeartbeatRequest(client_type=definition_pb2.ClientType.PRODUCER)
    with grpc.insecure_channel(endpoint) as channel:
        heartbeat = service_pb2_grpc.MessagingServiceStub(channel).Heartbeat
        for _ in range(count):
            heartbeat(request, metadata=metadata, timeout=10)


class GmsSide:
    """gms's own SDK doing the same."""

    def __init__(self, address: str) -> None:
        from gms.client import Producer, SimpleConsumer
        self.producer = Producer([address])
        self.consumer = SimpleConsumer([address], group="bench-gms", subscription={TOPIC: "*"}, start_from="first",
                                       await_duration_ms=2000)

    def send(self, count: int) -> None:
        for _ in range(count):
            self.producer.send(TOPIC, BODY, tag="T")

    def send_async(self, count: int) -> None:
        _pipelined(lambda i: self.producer.send_async(TOPIC, BODY, tag="T"), count)

    def consume(self, count: int) -> None:
        got = 0
        while got < count:
            messages = self.consumer.receive(RECEIVE_MAX)
            for message in messages:
                message.body  # noqa: B018 - read as an application does
            self.consumer.ack(messages)
            got += len(messages)

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()


def run(sends: int, pipelined: int) -> dict[str, float]:
    from gms.client import Admin
    from gms.nameserver.embedded_etcd import free_port

    with tempfile.TemporaryDirectory(prefix="bench-rmq-") as tmp:
        root = Path(tmp)
        endpoint = f"127.0.0.1:{free_port()}"
        proc, port = start_server("gms.broker", root, "broker", "--store-dir", str(root / "store"),
                                  "--rocketmq-listen", endpoint)
        address = f"127.0.0.1:{port}"
        try:
            with Admin([address]) as admin:
                admin.create_topic(TOPIC, queues=4)
            _wait_idle(proc.pid)
            rmq, native = RocketMQSide(endpoint), GmsSide(address)
            out: dict[str, float] = {}
            empty_rpcs(endpoint, 100)  # connected and warm
            out["empty_rpcs_per_s"], out["empty_rpc_server_cpu_us"] = (
                round(figure, 1) for figure in _measured(proc.pid, sends, lambda: empty_rpcs(endpoint, sends)))
            try:
                for name, side in (("rmq", rmq), ("gms", native)):
                    for workload, count in (("send", sends), ("async", pipelined)):
                        rate, cpu = _measured(proc.pid, count, lambda s=side, w=workload, c=count: getattr(
                            s, "send" if w == "send" else "send_async")(c))
                        out[f"{name}_{workload}_msgs_per_s"] = round(rate)
                        out[f"{name}_{workload}_server_cpu_us"] = round(cpu, 1)
                total = sends + pipelined
                for name, side in (("rmq", rmq), ("gms", native)):  # each group reads every message once
                    rate, cpu = _measured(proc.pid, 2 * total, lambda s=side: s.consume(2 * total))
                    out[f"{name}_consume_msgs_per_s"] = round(rate)
                    out[f"{name}_consume_server_cpu_us"] = round(cpu, 1)
            finally:
                rmq.close()
                native.close()
        finally:
            stop_servers([proc])
    for workload in ("send", "async", "consume"):
        out[f"{workload}_rate_ratio"] = round(out[f"rmq_{workload}_msgs_per_s"] / out[f"gms_{workload}_msgs_per_s"], 3)
        out[f"{workload}_server_cpu_ratio"] = round(
            out[f"rmq_{workload}_server_cpu_us"] / max(out[f"gms_{workload}_server_cpu_us"], 0.1), 2)
    out["empty_rpc_over_native_send"] = round(out["empty_rpc_server_cpu_us"] / out["gms_send_server_cpu_us"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts (about a minute)")
    parser.add_argument("--sends", type=int, help="synchronous sends per client (default 5000; 1000 with --quick)")
    parser.add_argument("--pipelined", type=int, help="pipelined sends per client (default 50000; 10000 with --quick)")
    args = parser.parse_args()
    sends = args.sends or (1000 if args.quick else 5000)
    pipelined = args.pipelined or (10_000 if args.quick else 50_000)
    print(json.dumps({"sends": sends, "pipelined": pipelined, **run(sends, pipelined)}))


if __name__ == "__main__":
    main()

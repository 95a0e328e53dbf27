"""Kernel receive stamps (harness/client/stamped_http.py): present, never later than the loop's, right when the loop
is late; the fallback is chosen and said; the closed loop sends before its bookkeeping; bad HTTP fails one
request with its reason. Loopback servers only; timing asserted as relations, never absolute times."""

import asyncio
import importlib.util
import json
import statistics
import time
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import pytest
from groundtruth_server import (
    GroundTruthConfig,
    GroundTruthProcess,
    GroundTruthServer,
    errors_against_truth,
    fetch_stats,
    gt_request,
)

from harness.client import stamped_http
from harness.client.runner import Runner, Target, turn_messages
from harness.results.folder import ResultWriter, read_records
from harness.runs.run import RunSteps
from harness.scenario.scenario import ScenarioError, load_scenario

pytestmark = pytest.mark.skipif(
    stamped_http.kernel_stamps_unavailable("http://x") is not None, reason="no kernel receive stamps on this system"
)


async def _run_in_process(requests, concurrency=None, on_record=None, **target):
    server = GroundTruthServer(GroundTruthConfig(ttft_ms=5, itl_ms=2))
    port = await server.start()
    try:
        return await Runner(
            Target(url=f"http://127.0.0.1:{port}", **target), requests, concurrency, on_record=on_record
        ).run()
    finally:
        await server.stop_listening()


async def test_each_chunk_has_a_kernel_stamp_no_later_than_the_loops_and_requests_jsonl_keeps_both(tmp_path):
    writer = ResultWriter(tmp_path)
    out = await _run_in_process(
        [gt_request(i, 0.003 * i, 12) for i in range(6)], on_record=writer.append, stamps="kernel"
    )
    writer.close()
    on_disk = read_records(tmp_path)
    assert len(on_disk) == 6
    for rec in on_disk:
        assert rec.ok and rec.stamp_source == "kernel"
        assert len(rec.token_times_s) == len(rec.token_loop_times_s) == 12
        assert all(k <= lp for k, lp in zip(rec.token_times_s, rec.token_loop_times_s))
        assert rec.token_times_s == sorted(rec.token_times_s)
        assert rec.actual_send_s <= rec.request_written_s < rec.token_times_s[0]
    assert [r.to_json() for r in sorted(out.records, key=lambda r: r.index)] == [
        r.to_json() for r in sorted(on_disk, key=lambda r: r.index)
    ]


def test_a_blocked_loop_moves_the_loop_stamps_not_the_kernel_stamps():
    """The loop is blocked 12 ms every 31 ms while tokens come every 20 ms: shorter than a token gap, so the
    kernel's stamp of each chunk survives (a longer block merges two chunks into one stamp, see the module)."""

    async def blocking_load(url):
        loop = asyncio.get_running_loop()

        def block():
            time.sleep(0.012)
            loop.call_later(0.031, block)

        loop.call_later(0.031, block)
        return await Runner(Target(url=url, stamps="kernel"), [gt_request(i, 0.013 * i, 24) for i in range(4)]).run()

    with GroundTruthProcess(GroundTruthConfig(ttft_ms=30, itl_ms=20)) as gt:
        fetch_stats(gt.url)
        out = asyncio.run(blocking_load(gt.url))
        truth = fetch_stats(gt.url)["records"]
    assert all(r.ok and r.stamp_source == "kernel" for r in out.records)
    kernel = errors_against_truth(out.records, out.t0_ns, truth)
    loop = errors_against_truth(out.records, out.t0_ns, truth, loop_stamps=True)
    assert len(kernel["itl_err_ms"]) == len(loop["itl_err_ms"]) == 4 * 23
    kernel_p90 = statistics.quantiles([abs(e) for e in kernel["itl_err_ms"]], n=10)[-1]
    loop_p90 = statistics.quantiles([abs(e) for e in loop["itl_err_ms"]], n=10)[-1]
    assert loop_p90 > 4 * kernel_p90, (kernel_p90, loop_p90)
    # every chunk: the kernel saw it no later than the loop did, and no earlier than the server wrote it
    assert all(d >= 0 for d in kernel["delivery_ms"])
    assert statistics.median(kernel["delivery_ms"]) < statistics.median(loop["delivery_ms"])


async def test_without_kernel_stamps_auto_falls_back_to_the_loop_and_says_why(monkeypatch):
    monkeypatch.setattr(stamped_http, "SO_TIMESTAMPNS", None)
    out = await _run_in_process([gt_request(i, 0.0, 4) for i in range(3)], stamps="auto")
    assert all(r.ok and r.stamp_source == "loop" and not r.token_loop_times_s for r in out.records)
    assert stamped_http.choose_stamps("auto", "http://127.0.0.1:1") == (
        "loop",
        "linux has no SO_TIMESTAMPNS receive timestamps",
    )
    with pytest.raises(ValueError, match="backend.stamps: kernel is not available here"):
        Runner(Target(url="http://127.0.0.1:1", stamps="kernel"), [])


def test_tls_takes_the_loop_path_and_kernel_stamps_asked_over_tls_name_the_field(tmp_path):
    assert stamped_http.choose_stamps("auto", "https://engine:443")[0] == "loop"
    assert "TLS" in stamped_http.choose_stamps("auto", "https://engine:443")[1]
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: tls\nbackend: {kind: openai, url: 'https://127.0.0.1:8443', stamps: kernel}\nload: {rate: 1}\n"
    )
    # the scenario is valid as written; the machine is checked where the run starts, naming the field
    steps = RunSteps(
        load_scenario(scenario), ResultWriter(tmp_path / "run"), SimpleNamespace(url="https://127.0.0.1:8443")
    )
    with pytest.raises(ScenarioError, match=r"backend.stamps: kernel is not available here \(TLS"):
        steps.choose_load_site(None, ExitStack())


async def test_a_socket_that_refuses_the_option_is_stamped_by_the_loop(monkeypatch):
    monkeypatch.setattr(stamped_http, "SO_TIMESTAMPNS", 9999)  # no such option: setsockopt fails
    out = await _run_in_process([gt_request(0, 0.0, 4)], stamps="kernel")
    assert out.records[0].ok and out.records[0].stamp_source == "loop" and not out.records[0].token_loop_times_s


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
async def test_closed_loop_sends_the_next_request_before_the_previous_ones_bookkeeping(stamps):
    """A record writer that takes 40 ms: the next request's send -> written stays as short as the first's."""

    def slow_writer(rec):
        time.sleep(0.04)

    out = await _run_in_process(
        [gt_request(i, None, 4) for i in range(5)], concurrency=1, on_record=slow_writer, stamps=stamps
    )
    recs = sorted(out.records, key=lambda r: r.intended_send_s)
    assert all(r.ok for r in recs)
    send_to_written = [r.request_written_s - r.actual_send_s for r in recs]
    assert max(send_to_written[1:]) < 0.25 * 0.04, send_to_written  # a record's writing never sits in a send
    # and the next send is due when the previous stream ended, not when its record was written
    assert all(b.intended_send_s == a.end_s for a, b in zip(recs, recs[1:]))


EVENT = b'data: {"choices":[{"text":"a"}]}\n\n'
BAD_RESPONSES = {
    "bad_chunk_size": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata: {}\r\n", "malformed_http"),
    "early_close": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(EVENT), EVENT),
        "stream_cut",
    ),
    "short_body": (b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\ndata: [DONE]\n\n", "stream_cut"),
    "not_http": (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "malformed_http"),
}


@pytest.mark.parametrize("case", sorted(BAD_RESPONSES))
async def test_a_malformed_response_fails_its_request_with_the_reason(case):
    answer, reason = BAD_RESPONSES[case]

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        out = await Runner(Target(url=url, stamps="kernel", request_timeout_s=5), [gt_request(0, 0.0, 4)]).run()
    rec = out.records[0]
    assert rec.error_reason == reason, rec
    assert rec.error_detail and "Traceback" not in rec.error_detail


def test_the_probe_sees_one_stamp_per_read_and_merged_segments():
    """What the read design rests on (benchmarks/rx_timestamp_probe.py): three segments read late in one
    recvmsg carry the newest one's time; read one by one, the merged segments still share that time."""
    path = Path(__file__).parents[1] / "benchmarks" / "rx_timestamp_probe.py"
    spec = importlib.util.spec_from_file_location("rx_timestamp_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    late_reads = probe.late_reads
    sent, whole = late_reads(one_by_one=False)
    assert len(whole) == 1 and abs(whole[0] - sent[-1]) < abs(whole[0] - sent[0])
    sent, each = late_reads(one_by_one=True)
    assert len(each) == 3 and each[0] > sent[0] + (sent[1] - sent[0]) / 2  # not the first segment's own time


async def _capturing_server(seen: list[bytes]):
    """Keeps every request's raw bytes; answers each with a one-token chat stream ("hi")."""
    events = (
        b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n'
    )
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (
        len(events),
        events,
    )

    async def serve(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                seen.append(head + await reader.readexactly(length))
                writer.write(answer)
        except asyncio.IncompleteReadError:  # the client closed its connection
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
async def test_first_turns_built_before_t0_are_the_bytes_built_at_send_time_and_later_turns_carry_the_answer(stamps):
    seen: list[bytes] = []
    server = await _capturing_server(seen)
    port = server.sockets[0].getsockname()[1]
    lone = [gt_request(i, None, 4, chat=True) for i in range(2)]
    session = [gt_request(i, None, 4, chat=True) for i in (2, 3)]
    for turn, spec in enumerate(session):
        spec.session_id, spec.turn_index = 7, turn
    runner = Runner(Target(url=f"http://127.0.0.1:{port}", api="chat", stamps=stamps), lone + session, 2)
    try:
        out = await runner.run()
    finally:
        server.close()
    assert sorted(r.index for r in out.records if r.ok) == [0, 1, 2, 3]
    assert runner._prebuilt == {}  # every first turn was sent from its prebuilt bytes
    by_turn = {}  # its own (last) message -> what was on the wire: the whole request, or the body for aiohttp
    for raw in seen:
        body = raw.split(b"\r\n\r\n", 1)[1]
        by_turn[json.loads(body)["messages"][-1]["content"]] = raw if stamps == "kernel" else body
    for spec in lone + session[:1]:  # a prebuilt first turn is what the send-time path builds
        assert by_turn[spec.messages[0]["content"]] == runner._request_bytes(spec, turn_messages([], spec))
    later = json.loads(by_turn[session[1].messages[0]["content"]].split(b"\r\n\r\n")[-1])
    assert later["messages"] == [*session[0].messages, {"role": "assistant", "content": "hi"}, *session[1].messages]
    assert len(seen) == 4


def _gt_post(index: int, tokens: int = 1) -> bytes:
    body = json.dumps({"model": "m", "prompt": f"request [gt id={index}]", "max_tokens": tokens}).encode()
    return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def _until_recorded(server: GroundTruthServer, rid: str) -> dict:
    for _ in range(500):
        if rid in server.records:
            return server.records[rid]
        await asyncio.sleep(0.002)
    raise AssertionError(f"the server never read request {rid}")


async def test_the_ground_truth_server_keeps_the_kernels_arrival_apart_from_its_late_read():
    """A request that waits in the socket while the server's loop is blocked for 20 ms keeps its arrival time (the
    kernel's stamp), read 20 ms later; one read at once by an idle server has the two close together."""
    import socket

    server = GroundTruthServer(GroundTruthConfig(ttft_ms=1, itl_ms=1))
    port = await server.start()
    block_ns = 20_000_000
    try:
        with (
            socket.create_connection(("127.0.0.1", port)) as idle,
            socket.create_connection(("127.0.0.1", port)) as busy,
        ):
            idle.sendall(_gt_post(1))
            quiet = await _until_recorded(server, "1")
            sent_ns = time.perf_counter_ns()
            busy.sendall(_gt_post(2))  # the server cannot read it until this callback returns
            after_send_ns = time.perf_counter_ns()
            time.sleep(block_ns / 1e9)
            unblocked_ns = time.perf_counter_ns()
            late = await _until_recorded(server, "2")
    finally:
        await server.stop_listening()
    assert quiet["recv_kernel_ns"] <= quiet["recv_ns"]
    # arrived while the loop was blocked (loopback's receive path, in the send or soon after in ksoftirqd) ...
    assert sent_ns <= late["recv_kernel_ns"] <= unblocked_ns
    # ... and read only once the loop ran again: the record keeps the two apart
    assert after_send_ns + block_ns <= late["recv_ns"] and late["recv_kernel_ns"] < late["recv_ns"]


async def _open_client(port: int, connections: int) -> stamped_http.StampedClient:
    client = stamped_http.StampedClient(f"http://127.0.0.1:{port}", "/v1/completions", {}, timeout_s=5)
    await client.open_connections(connections)
    return client


async def test_a_wave_writes_every_request_in_order_and_a_send_that_fails_fails_only_its_own():
    import socket

    server = GroundTruthServer(GroundTruthConfig(ttft_ms=1, itl_ms=1))
    port = await server.start()
    client = await _open_client(port, 4)
    try:
        broken = client._idle[-2]  # the second one the wave takes
        broken.sock.shutdown(socket.SHUT_WR)  # its send fails (EPIPE)
        requests = [client.request_bytes(_gt_post(i, 2).split(b"\r\n\r\n", 1)[1]) for i in range(5)]
        wave = client.send_wave(requests)
        assert wave[4] is None  # four connections: the fifth request waits for post to connect
        sent = [e for e in wave if e is not None]
        assert len({id(e.conn) for e in sent}) == 4
        for a, b in zip(sent, sent[1:]):  # each its own times, one after the other
            assert a.start_ns <= a.out.written_ns <= b.start_ns <= b.out.written_ns
        answers = await asyncio.gather(
            *(client.post(r, sent=e) for r, e in zip(requests, wave)), return_exceptions=True
        )
    finally:
        client.close()
        await server.stop_listening()
    failed = [i for i, a in enumerate(answers) if isinstance(a, Exception)]
    assert failed == [1], answers
    assert answers[1].reason == "stream_cut" and "sending the request failed" in answers[1].detail
    assert all(answers[i].status == 200 and answers[i].end_ns >= answers[i].written_ns for i in (0, 2, 3, 4))
    assert sorted(server.records) == ["0", "2", "3", "4"]
    for i in (0, 2, 3):  # the kernel took each wave request after its send began and before its answer came back
        # (not "during its own send": loopback's receive path may run later, in ksoftirqd, on a busy machine)
        assert wave[i].start_ns <= server.records[str(i)]["recv_kernel_ns"] <= answers[i].end_ns


async def test_then_runs_in_the_read_that_ends_the_answer_with_its_connection_idle_again():
    server = GroundTruthServer(GroundTruthConfig(ttft_ms=1, itl_ms=1))
    port = await server.start()
    client = await _open_client(port, 1)
    events, chained = [], []
    first, second = (client.request_bytes(_gt_post(i, 3).split(b"\r\n\r\n", 1)[1]) for i in range(2))

    def then(answer):  # what a closed loop does: the next request, at once, on the freed connection
        events.append("then")
        chained.extend(client.send_wave([second]))

    try:
        conn = client._idle[0]
        answer = await client.post(first, then=then)
        events.append("post returned")
        assert chained[0] is not None and chained[0].conn is conn
        assert answer.end_ns <= chained[0].start_ns
        again = await client.post(second, sent=chained[0])
    finally:
        client.close()
        await server.stop_listening()
    assert events == ["then", "post returned"]
    assert again.status == 200 and sorted(server.records) == ["0", "1"]


async def test_a_closed_loops_requests_are_each_recorded_with_their_own_times_and_a_broken_connection_costs_one(
    monkeypatch,
):
    """Eight streams, 24 requests: the first wave all due at t0, each with its own send and written times; every
    later request due when its stream's previous one ended. One connection broken at t0 fails its request
    alone, with its reason."""
    import socket

    send_wave = stamped_http.StampedClient.send_wave

    def break_one_first(self, requests):
        if len(requests) > 1:  # the first wave, not a stream's next request
            self._idle[-3].sock.shutdown(socket.SHUT_WR)  # the wave's third send fails (EPIPE)
        return send_wave(self, requests)

    monkeypatch.setattr(stamped_http.StampedClient, "send_wave", break_one_first)
    out = await _run_in_process([gt_request(i, None, 4) for i in range(24)], concurrency=8, stamps="kernel")
    assert len(out.records) == 24
    failed = [r for r in out.records if not r.ok]
    assert len(failed) == 1 and failed[0].error_reason == "stream_cut", failed
    assert "sending the request failed" in failed[0].error_detail and failed[0].intended_send_s == 0.0
    wave = sorted((r for r in out.records if r.intended_send_s == 0.0), key=lambda r: r.actual_send_s)
    assert len(wave) == 8
    sent_ok = [r for r in wave if r.ok]
    for a, b in zip(sent_ok, sent_ok[1:]):
        assert a.actual_send_s <= a.request_written_s <= b.actual_send_s
    ends = {r.end_s for r in out.records}
    later = [r for r in out.records if r.intended_send_s != 0.0]
    assert len(later) == 16 and all(r.ok and r.intended_send_s in ends for r in later)
    assert all(r.intended_send_s <= r.actual_send_s <= r.request_written_s for r in later)

"""The plugin sidecar: ONE serving plugin in a process of its own.

``python -m skippyctl.plugins.sidecar --fd N SPEC`` loads the plugin SPEC names (a ``.so`` path:
a C plugin through skippy_plugin.h; otherwise an entry point in the group ``skippyctl.plugins``),
reads the link's ACTIVATE (the model and the operator's configuration) and activates the plugin
with it, answers READY (or LOAD_FAILED with a reason word: ``activate_failed`` when activation
failed) on the stream socket ``N``, then serves the
frames of :mod:`skippyctl.plugins.wire` until end of stream, when it calls the plugin's
``destroy``/``close`` and exits 0. The engine's link starts it (``sidecar_supervisor.py``); a
plugin that crashes takes only this process down.

Contract:

- frames are handled in order, one at a time, on the main thread (the plugin's one thread);
- a malformed frame is counted and reported (FAULT ``MALFORMED``), never fatal;
- a callback's failure — a Python exception, a C status other than OK/NO_PROPOSAL — is reported
  (FAULT with the callback and ``RAISED``/``ERROR_STATUS``; for a query, in its ANSWER) and the
  sidecar carries on; nothing is printed (an exception's text may quote token ids);
- the sidecar checks each request's stream: a run that does not start where the request's
  stream is (never expected from the link) is skipped and reported ``STREAM_GAP``, so the plugin
  only ever sees a contiguous stream;
- a query that arrives after its deadline is not asked: its pending run is applied as a commit
  (the stream stays complete) and it is answered ``EXPIRED``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import socket
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from skippyctl.plugins import abi
from skippyctl.plugins.api import (
    ABI_RECEIPT_FIELDS,
    DISCARD_REASON_CODES,
    OUTCOME_KIND_CODES,
    SPEC_MODE_CODES,
    ActivationContext,
    DiscardReason,
    OutcomeKind,
    PluginNotFound,
    PluginReceipt,
    ProposalOutcome,
    ProposalQuery,
    RequestIds,
    SpecKind,
    load_entry_point,
    parse_spec,
    stop_reason_code,
)
from skippyctl.plugins.wire import (
    AnswerStatus,
    Fault,
    Frame,
    Malformed,
    Msg,
    activation_parts,
    encode,
    figures_from_fields,
    read_frame,
)

Status = abi.PluginStatus


class LoadFailed(Exception):
    """The plugin could not be loaded; ``reason`` is a short machine word."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CallbackFailed(Exception):
    """A callback failed (``fault`` says how); raised by a host adapter."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.name)
        self.fault = fault


@dataclass(frozen=True, slots=True)
class Proposal:
    status: AnswerStatus
    tokens: array[int]


class PythonHost:
    """A Python plugin behind the sidecar's calls."""

    def __init__(self, name: str) -> None:
        try:
            self._plugin = load_entry_point(name)
        except PluginNotFound:
            raise LoadFailed("not_found") from None
        except Exception:  # noqa: BLE001 - any import or factory failure is a load failure
            raise LoadFailed("raised") from None
        self.name = name

    def _call(self, fn: object, *args: object) -> None:
        try:
            fn(*args)  # type: ignore[operator]  # a bound method of the plugin
        except Exception:  # noqa: BLE001 - a plugin's exception is counted, never fatal
            raise CallbackFailed(Fault.RAISED) from None

    def activate(self, context: ActivationContext) -> None:
        activate = getattr(self._plugin, "activate", None)
        if activate is None:
            return
        try:
            activate(context)
        except Exception:  # noqa: BLE001 - a plugin that cannot take its model does not load
            raise LoadFailed("activate_failed") from None

    def begin(self, ids: RequestIds, prompt: array[int], reused: int) -> None:
        self._call(self._plugin.begin, ids, tuple(prompt), reused)

    def commit(self, ids: RequestIds, start: int, tokens: array[int]) -> None:
        self._call(self._plugin.commit, ids, start, tuple(tokens))

    def propose(
        self, ids: RequestIds, capacity: int, deadline_ns: int, start: int, pending: array[int]
    ) -> Proposal:
        query = ProposalQuery(ids, capacity, deadline_ns, start, tuple(pending))
        try:
            answer = self._plugin.propose(query)
        except Exception:  # noqa: BLE001 - counted, never fatal
            return Proposal(AnswerStatus.RAISED, array("i"))
        if not answer:
            return Proposal(AnswerStatus.NO_PROPOSAL, array("i"))
        try:
            tokens = array("i", answer)
        except (TypeError, OverflowError, ValueError):
            return Proposal(AnswerStatus.INVALID_TOKEN_ID, array("i"))
        if len(tokens) > capacity:
            return Proposal(AnswerStatus.INVALID_TOKEN_COUNT, array("i"))
        return Proposal(AnswerStatus.OK, tokens)

    def outcome(self, ids: RequestIds, outcome: ProposalOutcome) -> None:
        """``proposal_outcome`` when the plugin has it; else ``outcome`` for a verified window
        (a plugin written before outcome kinds never hears of a discard)."""
        full = getattr(self._plugin, "proposal_outcome", None)
        if full is not None:
            self._call(full, ids, outcome)
        elif outcome.kind is not OutcomeKind.DISCARDED:
            self._call(
                self._plugin.outcome, ids, outcome.proposed, outcome.accepted, outcome.rejected
            )

    def finish(
        self, ids: RequestIds, start: int, suffix: array[int], receipt: PluginReceipt
    ) -> None:
        self._call(self._plugin.finish, ids, start, tuple(suffix), receipt)

    def abort(self, ids: RequestIds, reason: int) -> None:
        code = abi.AbortReasonCode
        self._call(
            self._plugin.abort,
            ids,
            code(reason) if reason in code._value2member_map_ else code.UNKNOWN,
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._plugin.close()


_NULL_IDS = ctypes.POINTER(ctypes.c_int32)()


def _pointer(tokens: array[int]) -> ctypes._Pointer[ctypes.c_int32]:
    if not tokens:
        return _NULL_IDS
    buf = (ctypes.c_int32 * len(tokens)).from_buffer(tokens)
    return ctypes.cast(buf, ctypes.POINTER(ctypes.c_int32))


class CHost:
    """A C plugin (skippy_plugin.h) behind the sidecar's calls."""

    def __init__(self, path: str) -> None:
        if not os.path.isfile(path):
            raise LoadFailed("not_found")
        try:
            self._lib = ctypes.CDLL(path)
        except OSError:
            raise LoadFailed("load_error") from None
        try:
            address = ctypes.cast(getattr(self._lib, abi.PLUGIN_INIT_SYMBOL), ctypes.c_void_p).value
        except AttributeError:
            raise LoadFailed("no_entry_point") from None
        if address is None:
            raise LoadFailed("no_entry_point")
        init = abi.skippy_plugin_init_v1_fn(address)
        vt = abi.skippy_plugin_v1()
        status = init(abi.PLUGIN_ABI_VERSION, ctypes.byref(vt), ctypes.sizeof(vt))
        if status == Status.UNSUPPORTED:
            raise LoadFailed("abi_mismatch")
        if status != Status.OK:
            raise LoadFailed("init_failed")
        if vt.abi_version != abi.PLUGIN_ABI_VERSION or vt.struct_size < abi.PLUGIN_V1_BASE_SIZE:
            raise LoadFailed("abi_mismatch")
        self._vt = vt
        self._extended = vt.struct_size >= abi.PLUGIN_V1_SIZE
        """The plugin was built against a header with ``activate`` and outcome kinds: it is
        activated and hears of discards (an 80-byte vtable is never read past its size)."""
        self.name = (vt.name or b"").decode("utf-8", "replace")[:64]
        self._ids = abi.skippy_plugin_ids_v1(struct_size=ctypes.sizeof(abi.skippy_plugin_ids_v1))

    def _ids_of(self, ids: RequestIds) -> abi.skippy_plugin_ids_v1:
        c = self._ids
        c.request_id = ids.request
        c.session_id = ids.session or 0
        c.flags = 0 if ids.session is None else abi.IdsFlag.HAS_SESSION
        return c

    @staticmethod
    def _check(status: int) -> None:
        if status not in (Status.OK, Status.NO_PROPOSAL):
            raise CallbackFailed(Fault.ERROR_STATUS)

    def activate(self, context: ActivationContext) -> None:
        if not self._extended or not self._vt.activate:
            return
        model_id = context.model_id.encode("utf-8")
        config = context.config.encode("utf-8")
        a = abi.skippy_plugin_activation_v1(
            struct_size=ctypes.sizeof(abi.skippy_plugin_activation_v1),
            spec_mode=SPEC_MODE_CODES.get(context.spec_mode, abi.SpecModeCode.UNKNOWN),
            model_id=model_id,
            config=config,
            config_len=len(config),
            n_vocab=context.n_vocab,
            n_ctx_per_lane=context.n_ctx_per_lane,
            lanes=context.lanes,
            proposal_deadline_ns=round(context.proposal_deadline_ms * 1e6),
        )
        if self._vt.activate(self._vt.state, ctypes.byref(a)) != Status.OK:
            raise LoadFailed("activate_failed")

    def begin(self, ids: RequestIds, prompt: array[int], reused: int) -> None:
        if not self._vt.begin:
            return
        b = abi.skippy_plugin_begin_v1(
            struct_size=ctypes.sizeof(abi.skippy_plugin_begin_v1),
            prompt=_pointer(prompt),
            prompt_count=len(prompt),
            reused_count=reused,
        )
        self._check(
            self._vt.begin(self._vt.state, ctypes.byref(self._ids_of(ids)), ctypes.byref(b))
        )

    def _tokens(self, start: int, tokens: array[int]) -> abi.skippy_plugin_tokens_v1:
        return abi.skippy_plugin_tokens_v1(start=start, ids=_pointer(tokens), count=len(tokens))

    def commit(self, ids: RequestIds, start: int, tokens: array[int]) -> None:
        if not self._vt.commit:
            return
        t = self._tokens(start, tokens)
        self._check(
            self._vt.commit(self._vt.state, ctypes.byref(self._ids_of(ids)), ctypes.byref(t))
        )

    def propose(
        self, ids: RequestIds, capacity: int, deadline_ns: int, start: int, pending: array[int]
    ) -> Proposal:
        if not self._vt.propose:
            # No proposer: the pending run is still part of the stream.
            self.commit(ids, start, pending)
            return Proposal(AnswerStatus.NO_PROPOSAL, array("i"))
        out = array("i", bytes(4 * capacity))
        q = abi.skippy_plugin_query_v1(
            struct_size=ctypes.sizeof(abi.skippy_plugin_query_v1),
            capacity=capacity,
            deadline_mono_ns=deadline_ns,
            pending=self._tokens(start, pending),
            out_ids=_pointer(out),
            out_count=0,
        )
        status = self._vt.propose(self._vt.state, ctypes.byref(self._ids_of(ids)), ctypes.byref(q))
        if status == Status.NO_PROPOSAL:
            return Proposal(AnswerStatus.NO_PROPOSAL, array("i"))
        if status != Status.OK:
            code = AnswerStatus.INVALID_ARGUMENT if status == Status.INVALID_ARGUMENT else None
            return Proposal(code or AnswerStatus.ERROR, array("i"))
        if q.out_count > capacity:
            return Proposal(AnswerStatus.INVALID_TOKEN_COUNT, array("i"))
        return Proposal(AnswerStatus.OK, out[: q.out_count])

    def outcome(self, ids: RequestIds, outcome: ProposalOutcome) -> None:
        if not self._vt.outcome:
            return
        if outcome.kind is OutcomeKind.DISCARDED and not self._extended:
            return  # a plugin built before outcome kinds would read it as a verified window
        reason = outcome.discard_reason
        o = abi.skippy_plugin_outcome_v1(
            struct_size=ctypes.sizeof(abi.skippy_plugin_outcome_v1),
            proposed=outcome.proposed,
            accepted=outcome.accepted,
            rejected=outcome.rejected,
            kind=OUTCOME_KIND_CODES[outcome.kind],
            discard_reason=0 if reason is None else DISCARD_REASON_CODES[reason],
        )
        self._check(
            self._vt.outcome(self._vt.state, ctypes.byref(self._ids_of(ids)), ctypes.byref(o))
        )

    def finish(
        self, ids: RequestIds, start: int, suffix: array[int], receipt: PluginReceipt
    ) -> None:
        if not self._vt.finish:
            return
        r = receipt_struct(receipt)
        t = self._tokens(start, suffix)
        self._check(
            self._vt.finish(
                self._vt.state, ctypes.byref(self._ids_of(ids)), ctypes.byref(t), ctypes.byref(r)
            )
        )

    def abort(self, ids: RequestIds, reason: int) -> None:
        if not self._vt.abort:
            return
        self._check(self._vt.abort(self._vt.state, ctypes.byref(self._ids_of(ids)), reason))

    def close(self) -> None:
        if self._vt.destroy:
            self._vt.destroy(self._vt.state)


Host = PythonHost | CHost


def receipt_struct(receipt: PluginReceipt) -> abi.skippy_plugin_receipt_v1:
    """``receipt`` as the C struct: every field the v1 struct has (``ABI_RECEIPT_FIELDS``)."""
    return abi.skippy_plugin_receipt_v1(
        abi_version=abi.PLUGIN_ABI_VERSION,
        struct_size=ctypes.sizeof(abi.skippy_plugin_receipt_v1),
        stop_reason=receipt.stop_reason,
        **{name: getattr(receipt, name) for name in ABI_RECEIPT_FIELDS},
    )


_KINDS: Final = {int(code): kind for kind, code in OUTCOME_KIND_CODES.items()}
_REASONS: Final = {int(code): reason for reason, code in DISCARD_REASON_CODES.items()}


def outcome_of(proposed: int, accepted: int, kind: int, reason: int) -> ProposalOutcome:
    """An OUTCOME's fields as a :class:`ProposalOutcome`; raises ValueError (a malformed
    frame) for a kind or reason this sidecar does not know."""
    known = _KINDS.get(kind)
    if known is None:
        raise ValueError("unknown outcome kind")
    discard: DiscardReason | None = None
    if known is OutcomeKind.DISCARDED:
        discard = _REASONS.get(reason)
        if discard is None:
            raise ValueError("unknown discard reason")
    return ProposalOutcome(known, proposed, accepted, discard)


def load(spec: str) -> Host:
    parsed = parse_spec(spec)
    if parsed.kind is SpecKind.C:
        return CHost(parsed.target)
    return PythonHost(parsed.target)


@dataclass(slots=True)
class _Stream:
    ids: RequestIds
    next_index: int = 0


class Sidecar:
    """The frame loop (module docstring). ``serve`` returns at end of stream."""

    def __init__(self, sock: socket.socket, host: Host) -> None:
        self._sock = sock
        self._host = host
        self._streams: dict[int, _Stream] = {}
        self.malformed = 0
        self.gaps = 0

    def _send(self, frame: bytes) -> None:
        self._sock.sendall(frame)

    def _fault(self, callback: Msg | int, fault: Fault) -> None:
        self._send(encode(Msg.FAULT, int(callback), int(fault)))

    def serve(self) -> None:
        while True:
            try:
                frame = read_frame(self._sock)
            except Malformed:
                self.malformed += 1
                self._fault(0, Fault.MALFORMED)
                continue
            except (EOFError, ConnectionError):
                return
            try:
                self._handle(frame)
            except CallbackFailed as failed:
                self._fault(frame.kind, failed.fault)
            except (ValueError, TypeError, OverflowError):
                # fields out of range for the plugin's types: the frame is unusable
                self.malformed += 1
                self._fault(0, Fault.MALFORMED)

    def _stream(self, request: int, start: int | None, kind: Msg) -> _Stream | None:
        stream = self._streams.get(request)
        if stream is None or (start is not None and start != stream.next_index):
            self.gaps += 1
            if kind is not Msg.QUERY:
                self._fault(kind, Fault.STREAM_GAP)
            return None
        return stream

    def _handle(self, frame: Frame) -> None:
        host = self._host
        f = frame.fields
        match frame.kind:
            case Msg.BEGIN:
                request, session, flags, reused = (int(v) for v in f)
                ids = RequestIds(request, session if flags & abi.IdsFlag.HAS_SESSION else None)
                self._streams[request] = _Stream(ids)
                host.begin(ids, frame.tokens, reused)
            case Msg.COMMIT:
                request, start = int(f[0]), int(f[1])
                stream = self._stream(request, start, Msg.COMMIT)
                if stream is None:
                    return
                stream.next_index += len(frame.tokens)
                host.commit(stream.ids, start, frame.tokens)
            case Msg.QUERY:
                query_id, request, capacity, deadline, start = (int(v) for v in f)
                stream = self._stream(request, start, Msg.QUERY)
                if stream is None:
                    self._answer(query_id, Proposal(AnswerStatus.STREAM_GAP, array("i")))
                    return
                stream.next_index += len(frame.tokens)
                if time.monotonic_ns() > deadline or capacity < 1:
                    proposal = Proposal(AnswerStatus.EXPIRED, array("i"))
                    try:
                        if frame.tokens:
                            host.commit(stream.ids, start, frame.tokens)
                    finally:
                        self._answer(query_id, proposal)
                    return
                self._answer(
                    query_id, host.propose(stream.ids, capacity, deadline, start, frame.tokens)
                )
            case Msg.OUTCOME:
                request, proposed, accepted, _rejected, kind, reason = (int(v) for v in f)
                stream = self._stream(request, None, Msg.OUTCOME)
                if stream is not None:
                    host.outcome(stream.ids, outcome_of(proposed, accepted, kind, reason))
            case Msg.FINISH:
                request, start = int(f[0]), int(f[1])
                stream = self._stream(request, start, Msg.FINISH)
                self._streams.pop(request, None)
                if stream is not None:
                    receipt = PluginReceipt.of(
                        stop_reason_code(int(f[2])), figures_from_fields(f[3:])
                    )
                    host.finish(stream.ids, start, frame.tokens, receipt)
            case Msg.ABORT:
                request, reason = int(f[0]), int(f[1])
                stream = self._stream(request, None, Msg.ABORT)
                self._streams.pop(request, None)
                if stream is not None:
                    host.abort(stream.ids, reason)
            case Msg.ACTIVATE:
                # once, before READY (main); another one later is the link's mistake
                self.malformed += 1
                self._fault(0, Fault.MALFORMED)
            case _:
                # a sidecar → engine type sent the wrong way
                self.malformed += 1
                self._fault(0, Fault.MALFORMED)

    def _answer(self, query_id: int, proposal: Proposal) -> None:
        self._send(encode(Msg.ANSWER, query_id, int(proposal.status), tokens=proposal.tokens))


def read_activation(sock: socket.socket) -> ActivationContext | None:
    """The link's first frame, ACTIVATE, as the plugin's context; None at end of stream.
    Raises :class:`LoadFailed` (``protocol_error``) for any other first frame."""
    try:
        frame = read_frame(sock)
    except Malformed:
        raise LoadFailed("protocol_error") from None
    except (EOFError, ConnectionError):
        return None
    if frame.kind is not Msg.ACTIVATE:
        raise LoadFailed("protocol_error")
    spec_code, n_vocab, n_ctx, lanes, deadline_ns = (int(v) for v in frame.fields)
    model_id, config = activation_parts(frame.text)
    modes = {int(code): name for name, code in SPEC_MODE_CODES.items()}
    return ActivationContext(
        model_id=model_id,
        n_vocab=n_vocab,
        n_ctx_per_lane=n_ctx,
        lanes=lanes,
        spec_mode=modes.get(spec_code, "unknown"),
        proposal_deadline_ms=deadline_ns / 1e6,
        config=config,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skippyctl.plugins.sidecar")
    parser.add_argument("--fd", type=int, required=True, help="the stream socket to serve")
    parser.add_argument("spec", help="a C plugin's .so path or a Python entry-point name")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    try:
        try:
            host = load(args.spec)
            context = read_activation(sock)
            if context is None:
                return 0  # the link went away before it activated us
            host.activate(context)
        except LoadFailed as failed:
            sock.sendall(encode(Msg.LOAD_FAILED, text=failed.reason))
            return 2
        sock.sendall(encode(Msg.READY, abi.PLUGIN_ABI_VERSION, text=host.name))
        # the engine going away while we answer is the same as end of stream
        with contextlib.suppress(BrokenPipeError, ConnectionError):
            Sidecar(sock, host).serve()
        host.close()
        return 0
    finally:
        sock.close()


if __name__ == "__main__":
    raise SystemExit(main())

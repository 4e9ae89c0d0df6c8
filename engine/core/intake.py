"""Requests in: prompts to token ids, checks, and the queue that ``LLMEngine.step`` drains.

vLLM's ``Processor`` seam. :class:`Intake` turns a prompt (text, token ids, or chat messages through the
tokenizer's chat template) into token ids, checks it against the context and the queue's capacity, compiles the
request's grammar, builds its :class:`~engine.core.request.EngineRequest` and handle, and queues it. Callers on
any thread submit and cancel here; the stepping thread takes what arrived with :meth:`Intake.drain`.

The ``n`` requests of ``submit_n`` share a prompt: all but the first are held back (:meth:`Intake.drain`) until
the first has produced a token, so that they find its KV blocks in the prefix cache.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from engine.api import CapacityError, EngineConfig, RequestMetrics, SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.chat_template import chat_token_ids
from engine.core.context import fit_messages
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request import CancelCallback, EngineRequest, OutputCallback, Prompt, RequestHandle
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence

if TYPE_CHECKING:
    from engine.model.grammar import GrammarCompiler


class Intake:
    """Prompts in, queued requests out; thread-safe through :attr:`cv`."""

    def __init__(
        self,
        tokenizer: Any,
        config: EngineConfig,
        max_model_len: int,
        vocab_size: int,
        block_manager: BlockManager,
        scheduler: Scheduler,
        grammars: GrammarCompiler,
        eos_ids: frozenset[int],
        stopped: Callable[[], str | None],
    ) -> None:
        """``stopped`` says why the engine's loop died, or None while it lives: submitting then raises."""
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.block_manager = block_manager
        self.scheduler = scheduler
        self.grammars = grammars
        self.eos_ids = eos_ids
        self._stopped = stopped
        #: Guards the queue; the engine waits on it for work (an arrival notifies it).
        self.cv = threading.Condition()
        self._inbox: list[EngineRequest] = []
        self._held: list[EngineRequest] = []  # parallel requests waiting for their first one's prompt KV
        self._cancels: list[str] = []
        self._ids = itertools.count()

    # --- prompts -------------------------------------------------------------------------------------------
    def tokenize(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a prompt: text, ids, or chat messages (through the tokenizer's chat template, which
        renders ``tools``, OpenAI-style function definitions, when given)."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return self._in_vocabulary(list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"]))
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("prompt must be a non-empty string, list of token ids, or list of messages")
        if all(isinstance(t, int) for t in prompt):
            vocab = self.vocab_size
            if any(not 0 <= t < vocab for t in prompt):  # type: ignore[operator]
                raise ValueError(f"prompt token ids must lie in [0, {vocab})")
            return list(prompt)  # type: ignore[arg-type]
        if all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            # a trailing assistant message is a reply to continue, not a finished turn
            cont = prompt[-1]["role"] == "assistant"  # type: ignore[index]
            # message text that spells a control token stays text (engine/core/chat_template.py)
            messages = cast(list[dict[str, str]], prompt)
            extra: dict[str, Any] = {"tools": tools} if tools else {}
            try:
                ids = chat_token_ids(
                    self.tokenizer, messages, add_generation_prompt=not cont, continue_final_message=cont, **extra
                )
            except ValueError:
                raise
            except Exception as exc:
                raise ValueError(f"the model's chat template could not render these messages ({type(exc).__name__}: "
                                 f"{str(exc)[:300]})") from exc
            return self._in_vocabulary(ids)
        raise ValueError("messages must be dicts with 'role' and 'content'")

    def _in_vocabulary(self, ids: list[int]) -> list[int]:
        """``ids`` as the tokenizer made them, refused (for this request only) when empty or when one lies past the
        model's embedding: in a batch, such an id would fail every request stepped with it."""
        if not ids:
            raise ValueError("the prompt became no tokens at all (the model's chat template rendered nothing)")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"the tokenizer made token id {bad}, outside the model's vocabulary of {self.vocab_size}; the model's "
                "tokenizer and weights do not match, so this prompt cannot run"
            )
        return ids

    @property
    def room(self) -> int:
        """Most tokens (prompt and reply) one request may hold."""
        return min(self.max_model_len, self.block_manager.num_usable_blocks * self.config.block_size)

    def fit_context(self, messages: list[dict[str, str]], params: SamplingParams, overflow: str,
                    count_tokens: Callable[[list[dict[str, str]]], int] | None = None) -> Prompt:
        """``messages`` cut to fit the context with room for the reply, by ``overflow``'s policy. ``count_tokens``
        measures a cut chat as it will be sent (default: the chat template applied); a chat offered tools passes
        one that renders their definitions too, so that they count against the context."""
        room = self.room
        budget = room - min(params.max_tokens, room // 2)
        measure = count_tokens or (lambda m: len(self.tokenize(cast(Prompt, m))))
        return cast(Prompt, fit_messages(messages, budget, measure, overflow, context_length=room))

    # --- the queue -----------------------------------------------------------------------------------------
    def submit(
        self,
        token_ids: list[int],
        params_list: list[SamplingParams],
        priority: int,
        request_ids: list[str | None],
        on_outputs: list[OutputCallback | None],
        cancel: CancelCallback,
    ) -> list[RequestHandle]:
        """Queue one request per entry of ``params_list`` over ``token_ids``; the second and later wait for the
        first's prompt. ``ValueError`` for a prompt the context cannot hold or a bad grammar, ``CapacityError``
        for a full queue, ``RuntimeError`` once the engine has stopped."""
        matchers = [self.grammars.matcher(p) for p in params_list]
        room = self.room
        if len(token_ids) >= room:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but the context holds {room}; shorten the prompt"
            )
        with self.cv:
            stopped = self._stopped()
            if stopped is not None:
                raise RuntimeError(f"the engine has stopped ({stopped}); reload the model")
            if len(self._inbox) + len(self._held) + self.scheduler.num_waiting + len(params_list) > (
                self.config.max_waiting
            ):
                raise CapacityError(
                    f"{self.config.max_waiting} requests are already waiting; retry when some have finished"
                )
            handles = []
            first: EngineRequest | None = None
            for params, request_id, on_output, matcher in zip(
                params_list, request_ids, on_outputs, matchers, strict=True
            ):
                req = self._new_request(token_ids, params, priority, request_id, on_output, cancel, room)
                req.matcher, req.held_for = matcher, first
                first = first or req
                self._inbox.append(req)
                handles.append(req.handle)
            self.cv.notify_all()
        return handles

    def _new_request(
        self,
        token_ids: list[int],
        params: SamplingParams,
        priority: int,
        request_id: str | None,
        on_output: OutputCallback | None,
        cancel: CancelCallback,
        room: int,
    ) -> EngineRequest:
        rid = request_id or f"req-{next(self._ids)}"
        seq = Sequence(rid, list(token_ids), params, priority=priority)
        return EngineRequest(
            seq=seq,
            detok=IncrementalDetokenizer(self.tokenizer, params.stop),
            metrics=RequestMetrics(arrival_time=seq.arrival_time, num_prompt_tokens=len(token_ids)),
            handle=RequestHandle(cancel, rid, token_ids, on_output),
            max_tokens=min(params.max_tokens, room - len(token_ids)),
            eos_ids=frozenset() if params.ignore_eos else self.eos_ids,
            deadline=None if params.timeout_s is None else seq.arrival_time + params.timeout_s,
        )

    def cancel(self, request_id: str) -> None:
        with self.cv:
            self._cancels.append(request_id)
            self.cv.notify_all()

    def has_work(self) -> bool:
        return bool(self._inbox or self._cancels or self._held)

    @property
    def num_queued(self) -> int:
        """Requests submitted and not yet taken by :meth:`drain` (held ones aside)."""
        return len(self._inbox)

    def drain(self) -> tuple[list[EngineRequest], list[str]]:
        """What arrived since the last call: the requests ready to schedule, and the ids to cancel. A parallel
        request stays held while its first one has produced no token and is still going."""
        with self.cv:
            inbox, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
        waiting, self._held = [*self._held, *inbox], []
        ready = []
        for req in waiting:
            first = req.held_for
            if first is not None and first.metrics.first_token_time is None and not first.handle.done():
                self._held.append(req)
                continue
            req.held_for = None
            ready.append(req)
        return ready, cancels

    def release(self, request_id: str) -> EngineRequest | None:
        """Take a held request out of the queue (it is being cancelled); None if none is held by that id."""
        held = [r for r in self._held if r.seq.request_id == request_id]
        if not held:
            return None
        self._held.remove(held[0])
        return held[0]

    def take_all(self) -> list[EngineRequest]:
        """Empty the queue (queued and held requests) and drop pending cancels; the engine fails what it gets."""
        with self.cv:
            inbox, self._inbox = self._inbox, []
            self._cancels.clear()
        held, self._held = self._held, []
        return [*inbox, *held]

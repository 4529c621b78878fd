"""Sampled tokens to a request's events: text deltas, then its finish reason and usage.

Text that could still become a stop string, or is an incomplete character, is held back until
the next token decides it.
"""

from __future__ import annotations

import time

from cft.engine.metrics import EngineMetrics
from cft.engine.model import Model
from cft.engine.request import GenRequest


class OutputProcessor:
    """Appends each sampled token to its request and streams what the client may see."""

    def __init__(self, model: Model, metrics: EngineMetrics) -> None:
        self.model = model
        self.metrics = metrics

    def advance(self, req: GenRequest, tok: int) -> None:
        """Append a sampled token: stream the new text, finish on EOS, a stop or max_tokens."""
        if not req.token_ids:
            req.first_token = time.monotonic()
            self.metrics.ttft.observe(req.first_token - req.arrived)
        self.metrics.generation_tokens.inc()
        req.token_ids.append(tok)
        if tok in self.model.eos_ids:
            self.finish(req, "stop")
            return
        req.text = self.model.decode(req.token_ids)
        for stop in req.sampling.stop:
            at = req.text.find(stop)
            if at >= 0:
                req.text = req.text[:at]
                self.finish(req, "stop")
                return
        # Hold back what could still become a stop string or an incomplete character.
        hold = max((len(s) - 1 for s in req.sampling.stop), default=0)
        safe = len(req.text) - hold
        if req.text.endswith("\ufffd"):
            safe = min(safe, len(req.text) - 1)
        if safe > req.sent:
            req.emit("delta", req.text[req.sent : safe])
            req.sent = safe
        if len(req.token_ids) >= req.sampling.max_tokens:
            self.finish(req, "length")

    def finish(self, req: GenRequest, reason: str) -> None:
        """End a request: flush its held-back text and send its finish reason and usage."""
        req.finish_reason = reason
        if len(req.text) > req.sent:
            req.emit("delta", req.text[req.sent :])
            req.sent = len(req.text)
        req.emit("done", {"finish_reason": reason, "completion_tokens": len(req.token_ids)})

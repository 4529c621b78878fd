"""vLLM's OpenAI-compatible wire format, the subset the engine speaks.

Request bodies, the response objects (whole, streamed chunks, usage, model cards) and the error
body, with vLLM's field names and order: clients and the cft router parse them as vLLM's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    """OpenAI's stream_options."""

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """What chat and completion requests share."""

    # Unknown fields are ignored, as vLLM does (it logs them).
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None


class ChatMessage(BaseModel):
    """One chat message; content is text or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(GenerationRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int]
    echo: bool = False


class LoadLoRAAdapterRequest(BaseModel):
    """POST /v1/load_lora_adapter."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    """POST /v1/unload_lora_adapter."""

    lora_name: str
    lora_int_id: int | None = None


class ErrorInfo(BaseModel):
    """vLLM's error: the OpenAI shape with the HTTP status as the code."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """The body of every error, and the event that ends a failed stream."""

    error: ErrorInfo


class ModelPermission(BaseModel):
    """The one permission entry vLLM lists per model."""

    object: Literal["model_permission"] = "model_permission"
    allow_sampling: bool = True
    allow_view: bool = True


class ModelCard(BaseModel):
    """One entry of GET /v1/models: the base (no parent) or an adapter (parent: the base)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: Literal["vllm"] = "vllm"
    root: str
    parent: str | None
    max_model_len: int | None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(BaseModel):
    """GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class UsageInfo(BaseModel):
    """Tokens in, out and both."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    """The generated message of a whole chat completion."""

    role: Literal["assistant"] = "assistant"
    content: str
    tool_calls: list[Any] = Field(default_factory=list)


class ChatCompletionChoice(BaseModel):
    """The one choice of a whole chat completion."""

    index: int = 0
    logprobs: None = None
    finish_reason: str
    stop_reason: None = None
    message: AssistantMessage


class ChatCompletionResponse(BaseModel):
    """A whole chat completion."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class CompletionChoice(BaseModel):
    """The one choice of a whole text completion."""

    index: int = 0
    logprobs: None = None
    finish_reason: str
    stop_reason: None = None
    text: str


class CompletionResponse(BaseModel):
    """A whole text completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


def _absent_if_none(value: Any) -> bool:
    return value is None


class DeltaMessage(BaseModel):
    """A chat chunk's delta: only the fields it carries (the first one carries the role)."""

    role: Literal["assistant"] | None = Field(None, exclude_if=_absent_if_none)
    content: str | None = Field(None, exclude_if=_absent_if_none)


class ChatCompletionStreamChoice(BaseModel):
    """The one choice of a chat chunk."""

    index: int = 0
    logprobs: None = None
    finish_reason: str | None = None
    delta: DeltaMessage


class ChatCompletionChunk(BaseModel):
    """One streamed chat chunk; the usage chunk has no choices."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None


class CompletionStreamChoice(BaseModel):
    """The one choice of a text completion chunk."""

    index: int = 0
    logprobs: None = None
    finish_reason: str | None = None
    text: str


class CompletionChunk(BaseModel):
    """One streamed text completion chunk; the usage chunk has no choices."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


DONE = "data: [DONE]\n\n"


def error_body(
    message: str, error_type: str, status: int, param: str | None = None
) -> dict[str, Any]:
    """The error body as JSON-ready data."""
    info = ErrorInfo(message=message, type=error_type, param=param, code=status)
    return ErrorResponse(error=info).model_dump()


def sse(data: dict[str, Any]) -> str:
    """One server-sent event carrying data as JSON."""
    return f"data: {json.dumps(data)}\n\n"


@dataclass(frozen=True)
class Reply:
    """The response objects of one generation, whole or streamed, as JSON-ready data.

    Streamed chunks carry `"usage": null` when the client asked for a usage chunk
    (stream_options.include_usage) and no usage field otherwise, as vLLM's do.
    """

    id: str
    created: int
    model: str
    chat: bool
    prompt_tokens: int
    stream_usage: bool = False

    def usage(self, completion_tokens: int) -> UsageInfo:
        """Usage of the generation once it produced completion_tokens."""
        return UsageInfo(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=self.prompt_tokens + completion_tokens,
        )

    def whole(self, text: str, finish_reason: str, completion_tokens: int) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        response: ChatCompletionResponse | CompletionResponse
        if self.chat:
            response = ChatCompletionResponse(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[
                    ChatCompletionChoice(
                        finish_reason=finish_reason, message=AssistantMessage(content=text)
                    )
                ],
                usage=self.usage(completion_tokens),
            )
        else:
            response = CompletionResponse(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[CompletionChoice(finish_reason=finish_reason, text=text)],
                usage=self.usage(completion_tokens),
            )
        return response.model_dump()

    def chunk(
        self, text: str | None, finish_reason: str | None, *, role: bool = False
    ) -> dict[str, Any]:
        """A streamed chunk: new text (the first chat chunk: the role), or the finish reason."""
        chunk: ChatCompletionChunk | CompletionChunk
        if self.chat:
            delta = DeltaMessage(role="assistant" if role else None, content=text)
            chunk = ChatCompletionChunk(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[ChatCompletionStreamChoice(finish_reason=finish_reason, delta=delta)],
            )
        else:
            chunk = CompletionChunk(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[CompletionStreamChoice(finish_reason=finish_reason, text=text or "")],
            )
        return chunk.model_dump(exclude=None if self.stream_usage else {"usage"})

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        """The last chunk of a stream whose client asked for usage: no choices, the usage."""
        chunk_type = ChatCompletionChunk if self.chat else CompletionChunk
        chunk = chunk_type(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[],
            usage=self.usage(completion_tokens),
        )
        return chunk.model_dump()

"""Request and response bodies of the OpenAI-compatible routes, and of /v1/metadata (which `mbuild bench` reads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from runtimes.bundle.codec import ContractError, decode, encode
from runtimes.bundle.engine import EngineConfig
from runtimes.bundle.metadata import ModelInfo, ProfileInfo

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per embeddings request
# Every request body: a field the server does not implement is a 400 that names it, never silently ignored; and
# each value must have its JSON type, as OpenAI checks: true, never "yes" or 1; 5, never "5" or true.
STRICT = ConfigDict(extra="forbid", strict=True)
# What clients send back (assistant messages with refusal, annotations) carries metadata that changes nothing.
EXTRAS_IGNORED = ConfigDict(extra="ignore", strict=True)


MAX_ITEMS = 1 << 20
TEXTS_OR_IDS_WHAT = "a string, a list of strings, a list of token ids, or a list of such lists"


def _texts_or_ids(value: Any, _handler: ValidatorFunctionWrapHandler) -> Any:
    """A text, texts, token ids, or lists of token ids (what OpenAI's prompt and input fields take), checked
    here in one pass and never handed to pydantic's union: it would validate a long list against every
    member and report every bad item of each, which for one 100k-id request is tens of MB of errors that
    the process keeps as fragmented heap."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError(f"must be {TEXTS_OR_IDS_WHAT}")
    if len(value) > MAX_ITEMS:
        raise ValueError(f"holds {len(value)} items; at most {MAX_ITEMS}")
    kinds = {type(v) for v in value}
    if kinds <= {str} or kinds <= {int} or (kinds == {list} and all(type(i) is int for v in value for i in v)):
        return value
    raise ValueError(f"must be {TEXTS_OR_IDS_WHAT}")


TEXTS_OR_IDS = WrapValidator(_texts_or_ids)


InputType = Literal["query", "passage", "document", "search_query", "search_document"]
# Which of a model's prompt names each input_type means, first found first.
INPUT_PROMPTS: dict[str, tuple[str, ...]] = {
    "query": ("query",), "search_query": ("query",),
    "passage": ("passage", "document"), "document": ("document", "passage"),
    "search_document": ("document", "passage"),
}


class EmbeddingRequest(BaseModel):
    model_config = STRICT

    input: Annotated[str | list[str] | list[int] | list[list[int]], TEXTS_OR_IDS] = Field(
        description="A text or a list of texts to embed; or the model's token ids, one list or a list of lists.")
    model: str | None = Field(None, max_length=256, description="The served model name (see GET /v1/models).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=1 << 20, description="Must equal the model's dimension.")
    user: str | None = Field(None, max_length=256)
    truncate: Literal["NONE", "START", "END"] = Field(
        "NONE", description="What to do with an input over the model's token limit: NONE rejects it (400).")
    prompt_name: str | None = Field(None, max_length=64, description=(
        "One of the model's instruction prompts (sentence-transformers' and TEI's name), put before each text."))
    input_type: InputType | None = Field(None, description=(
        "What the texts are, as NIM and Cohere name it: a query gets the model's query prompt, a passage its "
        "document or passage prompt; ignored by a model without such prompts."))

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else [t for t in self.input if isinstance(t, str)]

    def token_ids(self) -> list[list[int]] | None:
        """The input as token ids (what LangChain's OpenAIEmbeddings sends), or None when it is text."""
        if isinstance(self.input, str) or not self.input or all(isinstance(t, str) for t in self.input):
            return None
        if all(isinstance(t, int) for t in self.input):
            return [list(self.input)]  # type: ignore[arg-type]
        if not all(isinstance(t, list) and all(type(i) is int for i in t) for t in self.input):
            raise ValueError("'input' mixes texts and token ids, or holds lists of something other than ids")
        return [t for t in self.input if isinstance(t, list)]


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


def _contract(cls: type, read: Callable[[Any], Any]) -> PlainValidator:
    """A bundle file's dataclass inside a body, read by its own decoder (runtimes/bundle/codec.py) so there is no
    second reading of the file's fields to drift; an instance (what the route builds from) passes as it is."""
    def validate(raw: Any) -> Any:
        if raw is None or raw == {} or isinstance(raw, cls):
            return raw or None
        try:
            return read(raw)
        except ContractError as exc:
            raise ValueError(str(exc)) from exc
    return PlainValidator(validate)


def _encoded(absent: dict[str, Any] | None) -> PlainSerializer:
    """Served as the file's JSON form; `absent` where the bundle has none."""
    return PlainSerializer(lambda value: absent if value is None else encode(value),
                           return_type=dict[str, Any] if absent is not None else dict[str, Any] | None)


class Metadata(BaseModel):
    """GET /v1/metadata: what this runtime serves. runtimes/api/probes.py builds it and `mbuild bench`
    (builder/benchmark/target.py) parses it, one type for both; a field a newer runtime adds is ignored."""

    name: str  # the first served name
    model: Annotated[ModelInfo | None, _contract(ModelInfo, lambda raw: decode(ModelInfo, raw, "metadata model")),
                     _encoded({})] = None  # metadata.json's; {} where the bundle has none (the gate's)
    profile: Annotated[ProfileInfo | None,
                       _contract(ProfileInfo, lambda raw: decode(ProfileInfo, raw, "metadata profile")),
                       _encoded({})] = None
    engine: Annotated[EngineConfig | None, _contract(EngineConfig, EngineConfig.from_dict), _encoded(None)] = None
    validation: dict[str, Any]  # the gate's headline (runtimes/bundle/report.py); {} where it never ran
    versions: dict[str, str]  # the build's tools and the runtime's release
    status: str  # runtimes/health.py's State; a string, so a reader of another release still parses it

"""Request and response bodies of the OpenAI-compatible routes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per embeddings request


class EmbeddingRequest(BaseModel):
    # A field the server does not implement is a 400 that names it, never silently ignored.
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] = Field(description="A text or a list of texts to embed.")
    model: str | None = Field(None, max_length=256, description="The served model name (see GET /v1/models).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=1 << 20, description="Must equal the model's dimension.")
    user: str | None = Field(None, max_length=256)
    truncate: Literal["NONE", "START", "END"] = Field(
        "NONE", description="What to do with an input over the model's token limit: NONE rejects it (400).")

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


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

"""lm-evaluation-harness scores the served model through its `local-completions` backend: a loglikelihood
(multiple-choice) task read from a local JSONL file, every item sent as token ids with echo and logprobs, as
the harness does against vLLM or OpenAI. The tiny model's score means nothing; that every item ran does."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.procs import served

# lm_eval's own HTTP sessions leave sockets for the garbage collector; that is the harness's, not the server's.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]
ITEMS = [{"context": f"The {noun} is", "choices": [" red", " blue", " green", " quick"], "label": i % 4}
         for i, noun in enumerate(["fox", "dog", "sky", "sea", "grass", "box", "car", "cat", "hat", "sun",
                                   "moon", "tree", "leaf", "bird", "fish", "door", "wall", "book", "cup", "pen",
                                   "road", "ship", "rock", "rain"])]


def _task(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "items.jsonl").write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    (folder / "mbuild_colours.yaml").write_text(f"""task: mbuild_colours
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / "items.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
""")
    return folder


def test_lm_eval_local_completions_runs_every_item(tiny_llm_build: Path, tiny_llama: Path, tmp_path: Path) -> None:
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(_task(tmp_path / "task")))
    with served(tiny_llm_build) as url:
        name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        results = lm_eval.simple_evaluate(
            model="local-completions", tasks=["mbuild_colours"], task_manager=tasks, batch_size=4,
            model_args=f"base_url={url}/v1/completions,model={name},tokenizer={tiny_llama},"
                       "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1")
    assert results is not None
    scores = results["results"]["mbuild_colours"]
    assert 0.0 <= scores["acc,none"] <= 1.0
    assert results["n-samples"]["mbuild_colours"]["effective"] == len(ITEMS)
    # Every choice of every item was scored: one loglikelihood request each.
    assert len(results["samples"]["mbuild_colours"]) == len(ITEMS)
    assert all(len(s["resps"]) == 4 for s in results["samples"]["mbuild_colours"])

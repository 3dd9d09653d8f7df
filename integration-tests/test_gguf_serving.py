"""`--model-id x.gguf`: the launcher serves a GGUF file (written by the gguf package from a tiny
Llama, Q8_0) split over two shards; greedy ids equal transformers loading the same file, and
the chat template comes from the file."""

import pytest
import requests
import torch
from it_cases import PROMPTS
from server_process import LauncherProcess

from tests.gguf_writer import write_gguf

pytestmark = pytest.mark.slow
MAX_NEW = 12


def test_gguf_file_served_over_two_shards_equals_transformers(tiny_model_dirs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_gguf(tiny_model_dirs["llama"], tmp_path / "tiny-llama.Q8_0.gguf", "Q8_0")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    ).eval()
    args = ["--dtype", "float32", "--num-shard", "2", "--max-batch-total-tokens", "4096"]
    env = {"SWITCHYARD_CACHE": str(tmp_path / "cache")}
    with LauncherProcess(path, *args, env=env) as server:
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            with torch.inference_mode():
                out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
            body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW, "details": True}}
            r = requests.post(f"{server.url}/generate", json=body, timeout=60)
            assert r.status_code == 200, r.text
            served = [t["id"] for t in r.json()["details"]["tokens"]]
            assert served == out[0, ids.shape[1] :].tolist(), prompt
        messages = [{"role": "user", "content": "Hello"}]
        r = requests.post(
            f"{server.url}/v1/chat/completions",
            json={"model": str(path), "messages": messages, "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        templated = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        assert r.json()["usage"]["prompt_tokens"] == len(templated)


def test_gemma3_gguf_with_a_sentencepiece_vocabulary_over_two_shards_equals_its_source(tmp_path):
    """A Gemma 3 file as llama.cpp writes one (SentencePiece pieces with scores, norms stored as
    1 + w, one global layer in six, the global layers' linear rope scaling in the metadata):
    served over two shards, greedy ids and logprobs equal transformers on the checkpoint the
    file was written from, fed the ids the file's own tokenizer gives."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.tiny_models import build_model
    from tests.shard.tiny_model_cases import GGUF_MODELS

    arch, cls, overrides = GGUF_MODELS["gemma3"]
    source = build_model(tmp_path / "hf", cls, **overrides)
    path = write_gguf(source, tmp_path / "tiny-gemma3.gguf", "F32", architecture=arch,
                      sentencepiece=True)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    args = ["--dtype", "float32", "--num-shard", "2", "--max-batch-total-tokens", "4096"]
    env = {"SWITCHYARD_CACHE": str(tmp_path / "cache")}
    with LauncherProcess(path, *args, env=env) as server:
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            assert ids[0, 0] == tokenizer.bos_token_id  # the file asks for BOS, as Gemma's do
            with torch.inference_mode():
                out = model.generate(
                    ids, max_new_tokens=MAX_NEW, do_sample=False, output_logits=True,
                    return_dict_in_generate=True, pad_token_id=0,
                )  # fmt: skip
            body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW, "details": True}}
            r = requests.post(f"{server.url}/generate", json=body, timeout=60)
            assert r.status_code == 200, r.text
            tokens = r.json()["details"]["tokens"]
            assert [t["id"] for t in tokens] == out.sequences[0, ids.shape[1] :].tolist(), prompt
            for token, logits in zip(tokens, out.logits, strict=True):
                want = torch.log_softmax(logits[0].float(), -1)[token["id"]].item()
                assert token["logprob"] == pytest.approx(want, abs=1e-3), prompt

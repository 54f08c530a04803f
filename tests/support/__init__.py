"""Test helpers: tiny models made at test time, a loopback Hugging Face Hub, process helpers."""

"""The sample data of `keras-attn demo`, written for this project (tools/make_sample_data.py)."""

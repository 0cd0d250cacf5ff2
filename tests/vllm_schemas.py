"""vLLM 0.33's top-k op schemas, exactly as its released libraries register them (`_C_stable_libtorch`:
`torch.ops._C.*`; `_deepselect_C`: `torch.ops.deep_select.topk`), for every stand-in that registers them."""

SCHEMAS_C = {
    "top_k_per_row_prefill": "top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, Tensor! indices, "
                             "int numRows, int stride0, int stride1, int topK) -> ()",
    "top_k_per_row_decode": "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor! indices, "
                            "int numRows, int stride0, int stride1, int topK) -> ()",
    "persistent_topk": "persistent_topk(Tensor logits, Tensor lengths, Tensor! output, Tensor workspace, int k, "
                       "int max_seq_len) -> ()",
    "cooperative_topk": "cooperative_topk(Tensor logits, Tensor lengths, Tensor! output, Tensor workspace, int k, "
                        "int max_seq_len) -> ()",
}
SCHEMA_DS = ("topk(Tensor input, int topk, Tensor? begin, Tensor? end, bool sorted_value, bool sorted_index, "
             "Tensor(a!)? output_value, Tensor(b!) output_index, Tensor? output_idx_offset, int idx_oob_fill_value, "
             "float value_oob_fill_value, bool return_value, bool abort_when_nan_found) -> ()")

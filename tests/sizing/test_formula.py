from dispatcher.sizing import combine_bytes_per_token, dispatch_bytes_per_token, workspace_layout


def test_worked_value_deepseek_ep8_cap1024_bf16():
    dispatch = dispatch_bytes_per_token(7168, 8, "bf16")
    combine = combine_bytes_per_token(7168)
    layout = workspace_layout(8, 1024, dispatch, combine)
    assert (dispatch, combine) == (14_400, 14_336)
    assert layout.aux_bytes == 180_608
    assert layout.workspace_bytes_per_rank == 235_585_920

"""The all-to-all traffic of an expert-parallel MoE layer, predicted from the routers' choices alone, against
what the communication counter recorded from the split sizes the all-to-alls were called with (ungraded; runs
the expert-parallel solution: ``needs_solution``)."""
import pytest

from moe.labs.experiments import predicted_row_traffic


def test_predicted_row_traffic_counts_each_off_rank_row_twice_each_way():
    rows_to = [[5, 3], [2, 7]]  # rank 0 routes 3 rows to rank 1; rank 1 routes 2 rows to rank 0
    # rank 0 sends 3 (dispatch) + 3 (combine backward) + 2 (combine) + 2 (dispatch backward) rows of 4 x 4 bytes
    assert predicted_row_traffic(rows_to, hidden=4) == [10 * 16, 10 * 16]
    assert predicted_row_traffic([[4]], hidden=8) == [0.0], "one rank keeps everything"
    with pytest.raises(ValueError, match="must be 2 x 2"):
        predicted_row_traffic([[1, 2], [3]], hidden=4)


@pytest.mark.needs_solution
def test_the_counter_records_what_the_routers_chose_to_send():
    from course.launch import launch
    from moe.labs.experiments import all_to_all_worker

    out = launch(all_to_all_worker, 2, 4, 2, 16, 24, device="cpu", timeout=120)
    rows_to = [out[r]["router_rows_to"] for r in range(2)]
    assert all(sum(row) == 24 * 2 for row in rows_to), "dropless top-2: every token's two choices are routed"
    predicted = predicted_row_traffic(rows_to, hidden=16)
    recorded = [sum(rec[3] for rec in out[r]["records"] if len(rec[4]) == 2) for r in range(2)]
    assert recorded == predicted  # integers of rows x 64 bytes: exact

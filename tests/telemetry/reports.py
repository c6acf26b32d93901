"""Valid report pieces for tests that need a RankReport without running a rank."""

from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import CumulativeCounters, Interval, RankReport, RankIdentity


def make_report(*, counters: CumulativeCounters, interval: Interval, sequence: int = 0,
                boot_id: str = "boot-a", cap: int = 16, ep_size: int = 2) -> RankReport:
    return RankReport(
        identity=RankIdentity(cluster="unit", ep_rank=0, ep_size=ep_size, boot_id=boot_id),
        sequence=sequence,
        sent_unix_s=interval.end_unix_s,
        config=rank_config(cap=cap, ep_size=ep_size, hidden_size=8, top_k=2, num_experts=4, backend="torch"),
        counters=counters,
        interval=interval,
    )

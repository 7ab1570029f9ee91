"""SBP sharding algebra, cost prediction, strategy search, ranking metrics, validation harness."""

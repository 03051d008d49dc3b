"""mqadmin's statistics and queue commands: brokerStatus, statsAll, brokerConsumeStats, queryCq..."""

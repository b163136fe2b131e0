"""One request's context work: compaction under its policy, the exchange with the upstream
(overflow retry, restore rounds, the conversation's record) and the restore tool."""

"""``brctl report``'s pure half: ``lost_time`` lays the job's time out as productive or lost to
a cause, ``incident`` builds the report's data (ETTR over time, lost time by cause, what happened
and to which machines) from what the state database holds."""

#!/usr/bin/env bash
# Run a batchgen job from cron until it is done. Each tick resumes where the last one stopped, so a
# reboot, a kill or a full disk costs at most one flush interval. Example crontab line (every 15 min):
#
#   */15 * * * * /opt/batchgen/examples/cron.sh /data/prompts.jsonl /data/completions.jsonl --model HuggingFaceTB/SmolLM2-1.7B-Instruct >> /var/log/batchgen.log 2>&1
#
# Set BATCHGEN=/path/to/.venv/bin/batchgen when batchgen is not on cron's PATH.
# Exit codes: 0 done (the job or an earlier tick finished it), 75 interrupted (the next tick resumes),
# anything else a real failure worth a look (cron mails the output when MAILTO is set).
set -uo pipefail

input=${1:?usage: cron.sh INPUT OUTPUT [batchgen run options...]}
output=${2:?usage: cron.sh INPUT OUTPUT [batchgen run options...]}
shift 2
batchgen=${BATCHGEN:-batchgen}

# A tick that finds the previous one still running leaves quietly (batchgen would refuse anyway:
# one run per OUTPUT).
exec 9>"${output}.cron.lock"
if ! flock -n 9; then
    echo "$(date -Is) $output: previous run still going"
    exit 0
fi

echo "$(date -Is) $output: starting"
"$batchgen" run "$input" "$output" --stats-file "${output}.stats.json" --log-every 60 "$@"
rc=$?
case $rc in
    0) echo "$(date -Is) $output: complete"; "$batchgen" status "$output" ;;
    75) echo "$(date -Is) $output: interrupted, the next tick resumes" ;;
    *) echo "$(date -Is) $output: failed (exit $rc)" ;;
esac
exit $rc

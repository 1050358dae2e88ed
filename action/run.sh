#!/usr/bin/env bash
# The step of svc-compile's GitHub Action (action.yml): `svc-compile check` of the paths,
# with annotations on the lines of the findings (workflow commands), then, when a base
# revision is given, `svc-compile diff` of each path between the base and HEAD. Both
# reports go to the job summary ($GITHUB_STEP_SUMMARY) as Markdown.
#
# Environment: INPUT_PATHS (space-separated, default `.`), INPUT_BASE (a git revision; empty:
# no diff), INPUT_ARGS (more flags for check and diff, e.g. `--exclude 'charts/**'`),
# SVC_COMPILE (the binary, default `svc-compile`), GITHUB_STEP_SUMMARY.
# Exit: 0 clean (a diff that shows changes is not a failure), 1 check found errors, 2 a
# command failed (usage, I/O, a revision that cannot be read).
set -uo pipefail

bin=${SVC_COMPILE:-svc-compile}
read -r -a paths <<< "${INPUT_PATHS:-.}"
read -r -a extra <<< "${INPUT_ARGS:-}"
summary=${GITHUB_STEP_SUMMARY:-/dev/null}
report=$(mktemp)
trap 'rm -f "$report"' EXIT

# Annotations (stdout: the runner reads the workflow commands), then the text for the summary.
"$bin" check "${paths[@]}" "${extra[@]}" --format github
check=$?
"$bin" check "${paths[@]}" "${extra[@]}" --color never -o "$report" >/dev/null 2>&1
{
  echo "## svc-compile check"
  echo
  case $check in
    0) echo "No errors." ;;
    1) echo "**Errors** in the manifests:" ;;
    *) echo "**check failed** (exit $check):" ;;
  esac
  echo
  echo '```text'
  cat "$report"
  echo '```'
} >> "$summary"

status=$check
if [ -n "${INPUT_BASE:-}" ]; then
  for p in "${paths[@]}"; do
    p=${p%/}
    [ "$p" = . ] && p=
    out=$(mktemp)
    "$bin" diff "git:${INPUT_BASE}:${p}" "git:HEAD:${p}" "${extra[@]}" --format markdown -o "$out"
    code=$?
    {
      echo
      echo "## svc-compile diff ${p:-.} (${INPUT_BASE:0:12}..HEAD)"
      echo
      case $code in
        0) echo "No change to any service or node." ;;
        1) cat "$out" ;;
        *) echo "**diff failed** (exit $code)." ;;
      esac
    } >> "$summary"
    rm -f "$out"
    if [ "$code" -ge 2 ] && [ "$status" -eq 0 ]; then
      status=2
    fi
  done
fi
exit "$status"

# threadbox bash context worker (embedded in the agent; see docs/interpreter.md, ADR 0083).
# Started by a `bash -c` bootstrap that reads this source from the control socket (fd
# 199). A cell is evaluated in this shell, so variables, functions, the working
# directory and exported variables persist. Requests are a header line
# `<count> <prologue bytes> <code bytes> <epilogue bytes>` and the three texts (the agent
# writes the per-cell environment as the prologue and its restoring as the epilogue).
# Output goes to fds 1/2, pipes read by the agent.
trap '' INT

__tb_read() {
  if (($2 == 0)); then
    printf -v "$1" ''
    return 0
  fi
  LC_ALL=C IFS= read -r -N "$2" -u 199 "$1"
}

# SIGINT during a cell returns from this function (with the agent's signal to the
# cell's processes, like a terminal's Ctrl-C); the shell and its state stay.
__tb_run() {
  trap '__tb_intr=1; trap "" INT; return 130' INT
  eval "$__tb_code"
}

printf '{"ev":"ready","pid":%d,"bash":"%s"}\n' "$$" "${BASH_VERSION%%[^0-9.]*}" >&199
while :; do
  IFS=' ' read -r -u 199 __tb_n __tb_pl __tb_cl __tb_el || exit 0
  __tb_read __tb_pro "$__tb_pl" || exit 0
  __tb_read __tb_code "$__tb_cl" || exit 0
  __tb_read __tb_epi "$__tb_el" || exit 0
  eval "$__tb_pro"
  __tb_intr=0
  printf '{"ev":"started"}\n' >&199
  # fd 199 is closed for the cell: the programs it starts never hold the channel
  # (bash keeps its copy close-on-exec while the redirection lasts).
  __tb_run 199>&-
  __tb_st=$?
  trap '' INT
  eval "$__tb_epi"
  if ((__tb_intr)); then
    printf '{"ev":"done","status":"exception","interrupted":true,"exit":%d}\n' "$__tb_st" >&199
  elif ((__tb_st != 0)); then
    printf '{"ev":"exception","name":"ExitStatus","value":"%d","traceback":"exit status %d"}\n' "$__tb_st" "$__tb_st" >&199
    printf '{"ev":"done","status":"exception","exit":%d}\n' "$__tb_st" >&199
  else
    printf '{"ev":"done","status":"ok","exit":0}\n' >&199
  fi
done

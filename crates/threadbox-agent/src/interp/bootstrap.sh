f=$THREADBOX_CTL_FD; unset THREADBOX_CTL_FD
exec 199<&"$f" || exit 70
exec {f}<&-
IFS= read -r -u 199 n || exit 70
LC_ALL=C IFS= read -r -N "$n" -u 199 s || exit 70
unset f n
eval "$s"

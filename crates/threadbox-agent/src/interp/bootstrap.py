import os,fcntl
f=int(os.environ.pop("THREADBOX_CTL_FD"))
fd=fcntl.fcntl(f,fcntl.F_DUPFD_CLOEXEC,200)
os.close(f)
h=b""
while not h.endswith(b"\n"):
 c=os.read(fd,1)
 if not c:raise SystemExit(70)
 h+=c
n=int(h);s=b""
while len(s)<n:
 c=os.read(fd,n-len(s))
 if not c:raise SystemExit(70)
 s+=c
del f,h,n,c
exec(compile(s,"<threadbox-worker>","exec"),{"__name__":"threadbox_worker","CTL_FD":fd})

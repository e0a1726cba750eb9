# bare fsync mechanisms, same loop type as the daemon: direct, io_uring (KernelFsync), a thread
import asyncio, os, sys, time, statistics, concurrent.futures
sys.path.insert(0, sys.argv[1])
import uvloop
from sessiond.log.store.kernelfsync import for_loop
N = 400
async def main():
    loop = asyncio.get_running_loop()
    fd = os.open("/tmp/sp/mech.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
    ring = for_loop(loop)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    res = {}
    sub = []
    for rnd in range(2):
        for how in ("direct", "uring", "thread"):
            t = []
            for i in range(N):
                os.write(fd, b"x" * 1500)
                s = time.perf_counter()
                if how == "direct":
                    os.fsync(fd)
                elif how == "uring":
                    fut = loop.create_future()
                    s1 = time.perf_counter()
                    ring.submit(fd, lambda e, f=fut: f.set_result(e))
                    sub.append((time.perf_counter() - s1) * 1000)
                    await fut
                else:
                    await loop.run_in_executor(pool, os.fsync, fd)
                t.append((time.perf_counter() - s) * 1000)
            res[how] = round(statistics.median(t), 3)
        print(os.getloadavg()[0], res, 'submit wall p50', round(statistics.median(sub), 4))
uvloop.run(main())

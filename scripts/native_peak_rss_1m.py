# Peak RSS of one native forward at n = 1,048,576, H=4, window W=256 (inputs included), and its time.
import resource, time, torch, attnlab as al
q, k, v = (torch.randn(1, 4, 1 << 20, 64) for _ in range(3))
t = time.perf_counter()
with torch.no_grad():
    out = al.attention(q, k, v, mask=al.masks.window(256, 0), backend="native")
print(f"fwd {time.perf_counter() - t:.2f} s; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB "
      f"(inputs {3 * q.numel() * 4 / 2**20:.0f} MB, output {out.numel() * 4 / 2**20:.0f} MB)")



def wino_case():
    C = random.choice([16, 32]); OC = random.choice([16, 32])
    p = random.randint(0, 2)
    H, W = random.randint(2, 7), random.randint(2, 7)
    if H + 2 * p - 2 < 1 or W + 2 * p - 2 < 1:
        return None
    N = random.choice([None, 1, 2])
    tr = random.random() < 0.3
    xs = ([N] if N else []) + [C, H, W]
    x = rnd(xs)
    w = rnd([C, OC, 3, 3] if tr else [OC, C, 3, 3], scale=0.2)
    b = rnd([OC]) if random.random() < 0.5 else None
    ip = [1, 1, 0, p, p, 0, 1, 1, 0, 0, 0, 0, 1, 0]
    tens = [('f', 1, x), ('f', 1, w), ('f', 1, b) if b is not None else None]

    def fn(T):
        if tr:
            return convt_ref(T[0], T[1], T[2], 2, [1, 1], [p, p], [1, 1], [0, 0], 1)
        return F.conv2d(T[0], T[1], T[2], padding=p)
    return Case('convt2d' if tr else 'conv2d', ip, [], tens, fn, 'wino C%d OC%d p%d H%d W%d N%s' % (C, OC, p, H, W, N))


GENS['wino'] = wino_case

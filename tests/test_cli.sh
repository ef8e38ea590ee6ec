#!/bin/sh
# tests/test_cli.sh - the examples' command line, run as a user would:
# every bad flag value is refused before any work (exit 2, a line naming the
# flag, the value and the rule, then the usage); --threads is limited;
# output paths are checked before training; a failed write, a non-finite
# loss or a --resume with other settings stops the run (exit 1, no partial
# files); --help everywhere; "saved to PATH" for each file written; each
# training example's loop is in its own file. Also test_smoke's skip line and
# run.sh's skip total. Trains only on a tiny made-up dataset (64 images),
# plus one short run on the real data when data/fashion-mnist has it.
# Prints "N passed, M failed" (", K skipped"); exit status 1 on a failure.
cd "$(dirname "$0")/.." || exit 1
B=build
T=$B/test_cli.tmp
rm -rf "$T" && mkdir -p "$T" || { echo "cannot create $T"; echo "0 passed, 1 failed"; exit 1; }
pass=0 fail=0 skip=0
TO=""; command -v timeout >/dev/null 2>&1 && TO="timeout 120"
TRAIN="lenet lenet_d2l mlp softmax_regression resnet"

ok() { pass=$((pass + 1)); }
no() { fail=$((fail + 1)); echo "FAIL $*"; }
skipped() { skip=$((skip + 1)); echo "SKIP $*"; }

# expect STATUS REGEX CMD ARGS...: CMD exits with STATUS and prints (stdout
# or stderr) a line matching the extended regex; its output is kept in $out.
expect() {
    want=$1 pat=$2
    shift 2
    out=$($TO "$@" 2>&1)
    rc=$?
    if [ "$rc" = "$want" ] && printf '%s\n' "$out" | grep -qE -- "$pat"; then ok
    else
        no "$*: expected status $want and a line like /$pat/; got status $rc:"
        printf '%s\n' "$out" | tail -n 6 | sed 's/^/    /'
    fi
}
# check DESCRIPTION COMMAND...: a shell test
check() {
    d=$1
    shift
    if "$@"; then ok; else no "$d"; fi
}
# the directory holds nothing (no partial or temporary files)
empty() { [ -z "$(ls -A "$1")" ]; }

# --- a tiny dataset in IDX format: 64 random images 28x28, labels 0..9 in turn
be32() {
    printf "\\$(printf %o $(($1 >> 24 & 255)))\\$(printf %o $(($1 >> 16 & 255)))"
    printf "\\$(printf %o $(($1 >> 8 & 255)))\\$(printf %o $(($1 & 255)))"
}
mkdata() {  # mkdata DIR [nan]: train and t10k splits; nan: one training pixel is NaN (float32 IDX)
    mkdir -p "$1"
    for split in train t10k; do
        if [ "${2:-}" = nan ] && [ $split = train ]; then
            { printf '\000\000\015\003'; be32 64; be32 28; be32 28; printf '\177\300\000\000'
              head -c $(((64 * 784 - 1) * 4)) /dev/zero; } > "$1/$split-images-idx3-ubyte"
        else
            { printf '\000\000\010\003'; be32 64; be32 28; be32 28
              head -c $((64 * 784)) /dev/urandom; } > "$1/$split-images-idx3-ubyte"
        fi
        { printf '\000\000\010\001'; be32 64; i=0
          while [ $i -lt 64 ]; do printf "\\$(printf %o $((i % 10)))"; i=$((i + 1)); done
        } > "$1/$split-labels-idx1-ubyte"
    done
}
D=$T/data
mkdata "$D"
mkdata "$T/nandata" nan
SHORT="--data $D --epochs 1 --batch 16"

# --- 16: strict numbers. Each bad value: exit 2, "--flag VALUE: rule"
for bad in "--epochs abc" "--epochs 1.5" "--epochs 5x" "--epochs -1" "--epochs 1001" \
           "--epochs 99999999999999999999" "--batch 0" "--batch -1" "--batch 65537" "--batch 1e3" \
           "--lr abc" "--lr -1" "--lr 0" "--lr 1e-60" "--lr 1e39" "--threads -3" "--threads abc" \
           "--workers -1" "--workers 65" "--workers two" "--seed -1" "--seed abc" \
           "--seed 18446744073709551616" "--limit -5" "--limit abc" "--limit 9223372036854775808"; do
    set -- $bad
    expect 2 "^$B/lenet: $1 $2: must be a" $B/lenet $bad --data "$D"
done
expect 2 "^$B/lenet: --epochs : must be a whole number from 0 to 1000" $B/lenet --epochs ""
expect 2 "^$B/lenet: --epochs needs a value" $B/lenet --epochs
expect 2 "^$B/lenet: unknown flag --epoch" $B/lenet --epoch 3
expect 2 "^$B/lenet: --save needs a path, got '--csv'" $B/lenet --save --csv x.csv
for e in $TRAIN; do
    expect 2 "^$B/$e: --epochs abc: must be a whole number from 0 to 1000" $B/$e --epochs abc
done
out=$($B/mlp --epochs abc 2>/dev/null)
check "a bad flag prints nothing on stdout" [ -z "$out" ]
expect 2 "^usage: $B/mlp \[--epochs N \(10\)\]" $B/mlp --epochs abc
# the edges of each range are accepted
expect 0 "^test accuracy: [01]\.[0-9]{4}$" $B/softmax_regression --data "$D" --epochs 0 --batch 65536 \
    --seed 18446744073709551615 --limit 9223372036854775807 --workers 0 --threads 0 --lr 1e-3

# --- 15: --threads: over 1024 is an error, over the cores is clamped with a warning
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
expect 2 "^$B/lenet: --threads 100000: must be a whole number from 0 to 1024" $B/lenet --threads 100000
expect 2 "^$B/lenet: --threads 1025: must be a whole number from 0 to 1024" $B/lenet --threads 1025
expect 0 "warning: --threads 1000 is more than this machine's $cores cores; using $cores" \
    $B/mlp $SHORT --threads 1000
check "--threads 1000 runs on $cores threads" eval "printf '%s\n' \"\$out\" | grep -q 'batch 16, $cores threads'"
expect 0 "batch 16, $cores threads$" $B/mlp $SHORT --threads 0

# --- 17: non-finite learning rates are refused; a NaN/Inf loss stops the run
expect 2 "^$B/lenet: --lr inf: must be a finite number > 0" $B/lenet --lr inf
expect 2 "^$B/lenet: --lr nan: must be a finite number > 0" $B/lenet --lr nan
expect 2 "^$B/lenet: --lr -inf: must be a finite number > 0" $B/lenet --lr -inf
for e in $TRAIN; do
    expect 1 "^$B/$e: $T/nandata/train-images-idx3-ubyte: image 0, pixel \(0, 0\) is nan: the data must be finite" \
        $B/$e --data "$T/nandata" --epochs 2 --batch 16
    check "$e: no training on NaN data" eval "! printf '%s\n' \"\$out\" | grep -q '^epoch'"
done
for e in $TRAIN; do
    expect 1 "^$B/$e: the loss is (NaN|infinite) at epoch [12], step [1-4] of 4: training diverged" \
        $B/$e $SHORT --epochs 2 --lr 1e38
    check "$e: stopped at the first non-finite loss" eval "[ \$(printf '%s\n' \"\$out\" | grep -c '^epoch') -le 1 ]"
done

# --- 18: output paths are checked before training; write failures stop the run
for f in --save --csv --svg; do
    expect 2 "^$B/mlp: $f /dev/full: a device, not a regular file" $B/mlp $SHORT $f /dev/full
    check "$f /dev/full: refused before training" eval "! printf '%s\n' \"\$out\" | grep -q '^epoch'"
    expect 2 "^$B/mlp: $f $T: a directory, not a regular file" $B/mlp $SHORT $f "$T"
    expect 2 "^$B/mlp: $f $T/no/such/out: the directory $T/no/such does not exist" $B/mlp $SHORT $f "$T/no/such/out"
done
expect 2 "^$B/mlp: --csv $T/a and --svg $T/a: two outputs in one file" $B/mlp $SHORT --csv "$T/a" --svg "$T/a"
if [ "$(id -u)" != 0 ]; then
    mkdir -p "$T/ro" && chmod 555 "$T/ro"
    expect 2 "^$B/mlp: --save $T/ro/ck.st: cannot create a file in $T/ro" $B/mlp $SHORT --save "$T/ro/ck.st"
    chmod 755 "$T/ro"
elif [ -d /sys ] && ! touch /sys/.dl-test-probe 2>/dev/null; then
    expect 2 "^$B/mlp: --save /sys/ck.st: cannot create a file in /sys" $B/mlp $SHORT --save /sys/ck.st
else
    skipped "test_cli: no unwritable directory for the probe (root, and /sys is writable)"
fi
# a write that fails mid-file (RLIMIT_FSIZE: write() fails with EFBIG, as on a full disk)
mkdir -p "$T/full"
expect 1 "^$B/mlp: --save $T/full/ck.st: .*File too large.*; stopping$" \
    sh -c 'trap "" XFSZ; ulimit -f 8; exec "$@"' sh $B/mlp $SHORT --epochs 2 --save "$T/full/ck.st"
check "--save failed: the run stopped after epoch 1" eval "! printf '%s\n' \"\$out\" | grep -q '^epoch  2'"
check "--save failed: no checkpoint or temporary left" empty "$T/full"
expect 1 "^$B/mlp: --svg $T/full/m.svg: writing failed: File too large; nothing written" \
    sh -c 'trap "" XFSZ; ulimit -f 1; exec "$@"' sh $B/mlp $SHORT --csv "$T/full/m.csv" --svg "$T/full/m.svg"
check "--svg failed: no svg or temporary left" [ "$(ls -A "$T/full")" = m.csv ]
# a full disk: a 64 KiB tmpfs in a private mount namespace (unshare -rm: no root needed)
cat > "$T/full.sh" <<'EOF'
#!/bin/sh
# full.sh DIR FILL CMD...: CMD with a 64 KiB tmpfs on DIR holding FILL bytes, then what is left in DIR
d=$1 fill=$2
shift 2
mount -t tmpfs -o size=64k tmpfs "$d" || exit 99
[ "$fill" -gt 0 ] && head -c "$fill" /dev/zero > "$d/.fill" 2>/dev/null
"$@"
rc=$?
rm -f "$d/.fill"
echo "left in $d: [$(ls -A "$d")]"
exit $rc
EOF
mkdir -p "$T/disk"
if command -v unshare >/dev/null 2>&1 && unshare -rm sh "$T/full.sh" "$T/disk" 0 true >/dev/null 2>&1; then
    expect 1 "^$B/mlp: --save $T/disk/ck.st: .*No space left on device.*; stopping$" \
        unshare -rm sh "$T/full.sh" "$T/disk" 0 $B/mlp $SHORT --epochs 2 --save "$T/disk/ck.st"
    check "full disk, --save: stopped after epoch 1, nothing left" eval "printf '%s\n' \"\$out\" | grep -q '^left in $T/disk: \[\]$' && ! printf '%s\n' \"\$out\" | grep -q '^epoch  2'"
    expect 1 "^$B/mlp: --csv $T/disk/m.csv: writing failed: No space left on device; nothing written$" \
        unshare -rm sh "$T/full.sh" "$T/disk" 65536 $B/mlp $SHORT --csv "$T/disk/m.csv" --svg "$T/disk/m.svg"
    check "full disk, --svg: refused too" eval "printf '%s\n' \"\$out\" | grep -q '^$B/mlp: --svg $T/disk/m.svg: writing failed: No space left on device'"
    check "full disk, --csv/--svg: no partial files" eval "printf '%s\n' \"\$out\" | grep -q '^left in $T/disk: \[\]$'"
else
    skipped "test_cli: no full filesystem: a tmpfs needs unshare -rm (user namespaces) or root; the failing write is covered with ulimit -f above"
fi

# --- 19: --resume checks the run's settings; --epochs may grow
R=$T/ck.st
expect 0 "^saved to $R$" $B/mlp $SHORT --save "$R"
expect 1 "^$B/mlp: --resume $R: the checkpoint was trained with --batch 16, this run has --batch 32$" \
    $B/mlp --data "$D" --epochs 2 --batch 32 --resume "$R"
expect 1 "^$B/mlp: --resume $R: the checkpoint was trained with --lr 0.05, this run has --lr 0.1$" \
    $B/mlp $SHORT --epochs 2 --lr 0.1 --resume "$R"
expect 1 "^$B/mlp: --resume $R: the checkpoint was trained with --seed 1, this run has --seed 2$" \
    $B/mlp $SHORT --epochs 2 --seed 2 --resume "$R"
expect 1 "^$B/mlp: --resume $R: the checkpoint was trained with --limit 0 \(64 training samples\), this run has --limit 32 \(32 training samples\)$" \
    $B/mlp $SHORT --epochs 2 --limit 32 --resume "$R"
expect 1 "^$B/lenet: --resume $R: the checkpoint was written by the example mlp, this is lenet$" \
    $B/lenet $SHORT --resume "$R"
expect 0 "^epoch  3  train loss" $B/mlp $SHORT --epochs 3 --resume "$R" --save "$R"
check "resumed at epoch 1" eval "printf '%s\n' \"\$out\" | grep -q '^resumed from $R at epoch 1$'"
check "resumed: epochs 2 and 3 only" eval "[ \$(printf '%s\n' \"\$out\" | grep -c '^epoch ') = 2 ]"
expect 1 "^$B/mlp: --resume $R: the checkpoint was trained with --epochs 3, this run has --epochs 2 " \
    $B/mlp $SHORT --epochs 2 --resume "$R"
expect 0 "^test accuracy: [01]\.[0-9]{4}$" $B/mlp $SHORT --epochs 3 --resume "$R"
check "a finished run resumed trains no more epochs" eval "! printf '%s\n' \"\$out\" | grep -q '^epoch'"
expect 1 "^$B/mlp: --resume $T/none.st: .*No such file" $B/mlp $SHORT --resume "$T/none.st"
expect 1 "^$B/mlp: dl_idx_load: cannot open '$T/nowhere/train-images-idx3-ubyte'" $B/mlp --data "$T/nowhere"

# --- 20: --help everywhere, graph --out, "saved to PATH" for each file
for e in $TRAIN custom_function gradcheck graph; do
    expect 0 "^usage: $B/$e " $B/$e --help
done
expect 2 "^$B/custom_function: unknown argument --out" $B/custom_function --out x
expect 2 "^$B/gradcheck: unknown argument x" $B/gradcheck x
expect 2 "^$B/graph: unknown flag --bogus" $B/graph --bogus
expect 2 "^$B/graph: --out needs a file name" $B/graph --out
expect 2 "^$B/graph: --out /dev/full: a device" $B/graph --out /dev/full
expect 0 "^saved to $T/g\.dot$" env PATH="$PWD/$T/nodot:/usr/bin:/bin" $B/graph --out "$T/g.dot"
check "graph: the DOT file" eval "head -n 1 '$T/g.dot' | grep -q '^digraph'"
mkdir -p "$T/bin"
printf '#!/bin/sh\n# fake Graphviz: dot -Tsvg IN -o OUT\necho "<svg/>" > "$4"\n' > "$T/bin/dot"
chmod +x "$T/bin/dot"
expect 0 "^saved to $T/g2\.svg$" env PATH="$PWD/$T/bin:$PATH" $B/graph --out "$T/g2.dot"
check "graph: saved to the .dot too" eval "printf '%s\n' \"\$out\" | grep -q '^saved to $T/g2.dot$'"
printf '#!/bin/sh\necho "dot: broken" >&2\nexit 3\n' > "$T/bin/dot"
mkdir -p "$T/g3"
expect 1 "^$B/graph: dot -Tsvg $T/g3/g\.dot failed \(exit status 3\)" env PATH="$PWD/$T/bin:$PATH" $B/graph --out "$T/g3/g.dot"
check "graph: a failed dot leaves no .svg or temporary" [ "$(ls -A "$T/g3")" = g.dot ]
expect 0 "^saved to $T/m\.csv$" $B/lenet $SHORT --save "$T/m.st" --csv "$T/m.csv" --svg "$T/m.svg"
check "lenet: saved to the checkpoint" eval "printf '%s\n' \"\$out\" | grep -q '^saved to $T/m.st$'"
check "lenet: saved to the chart" eval "printf '%s\n' \"\$out\" | grep -q '^saved to $T/m.svg$'"
check "lenet: the CSV" eval "[ \"\$(head -n 1 '$T/m.csv')\" = epoch,train_loss,train_acc,test_acc,seconds ] && [ \$(wc -l < '$T/m.csv') = 2 ]"
check "lenet: the SVG" eval "grep -q '</svg>' '$T/m.svg'"

# --- B: each training example trains with its own visible loop
for e in $TRAIN; do
    expect 0 "^epoch  1  train loss [0-9.]+  train acc [0-9.]+  test acc [0-9.]+  " $B/$e $SHORT
    check "$e: the last line is the test accuracy" eval "printf '%s\n' \"\$out\" | tail -n 1 | grep -qE '^test accuracy: [01]\.[0-9]{4}$'"
    for call in dl_optim_zero_grad dl_module_forward dl_cross_entropy dl_backward dl_optim_step \
                dl_no_grad_begin dl_no_grad_end "dl_module_train(net, false)" dl_loader_next; do
        check "examples/$e.c calls $call itself" grep -qF "$call" examples/$e.c
    done
done
check "examples/common.h has no training loop" eval "! grep -qE 'dl_backward|dl_optim_step\\(|dl_module_forward' examples/common.h"

# --- 22: test_smoke without the data says it skipped; run.sh sums skips
mkdir -p "$T/nodata"
expect 0 "^0 passed, 0 failed, 1 skipped$" sh -c 'cd "$1" && exec "$2"' sh "$T/nodata" "$PWD/$B/test_smoke"
check "test_smoke says why it skipped" eval "printf '%s\n' \"\$out\" | grep -q '^SKIP .*not found'"
printf '#!/bin/sh\necho "3 passed, 0 failed, 2 skipped"\n' > "$T/t1"
printf '#!/bin/sh\necho "4 passed, 0 failed"\n' > "$T/t2"
chmod +x "$T/t1" "$T/t2"
expect 0 "^7 passed, 0 failed, 2 skipped$" tests/run.sh "$T/t1" "$T/t2"
expect 0 "^4 passed, 0 failed$" tests/run.sh "$T/t2"

# --- a short run on the real data, when it is there
if [ -f data/fashion-mnist/train-images-idx3-ubyte ]; then
    expect 0 "^LeNet-BN on Fashion-MNIST: 62158 parameters, 512 train / 10000 test samples, batch 64" \
        $B/lenet --limit 512 --epochs 1 --batch 64
    check "lenet on real data: the epoch line and the accuracy" eval "printf '%s\n' \"\$out\" | tail -n 2 | head -n 1 | grep -q '^epoch  1  train loss' && printf '%s\n' \"\$out\" | tail -n 1 | grep -qE '^test accuracy: 0\.[0-9]{4}$'"
else
    skipped "test_cli: data/fashion-mnist not found, no run on the real data (run \`make data\`)"
fi

rm -rf "$T"
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]

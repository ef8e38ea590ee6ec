#!/bin/sh
# tests/test_cli.sh - the examples' command line, run as a user would:
# every bad flag value is refused before any work (exit 2, a line naming the
# flag, the value and the rule, then the usage); --threads is limited;
# output paths are checked before training; a failed write, a non-finite
# loss or a --resume with other settings stops the run (exit 1, no partial
# files); --help everywhere; "saved to PATH" for each file written; each
# training example's loop is in its own file; --logdir writes a TensorBoard
# events file (read back with TensorBoard's own loader when python3 has the
# tensorboard package), a bad --logdir is refused before training and a failed
# write to it stops the run; standard output that cannot be written is
# exit 1 in every program (examples/cli.h). Also test_smoke's skip line and
# run.sh's skip total. --device NAME (every one-device training example) and
# --devices A,B (model_parallel): bad names, cuda:0 without DL_CUDA, and on
# cpu:1 in strict mode the same epoch lines as on cpu. Trains only on a tiny
# made-up dataset (64 images), plus one short run on the real data when
# data/fashion-mnist has it. d2l's ResNet-18: resnet --arch d2l and
# data_parallel --model resnet18 on two devices, 2 steps of 4 images.
# Prints "N passed, M failed" (", K skipped"); exit status 1 on a failure.
cd "$(dirname "$0")/.." || exit 1
B=build
T=$B/test_cli.tmp
rm -rf "$T" && mkdir -p "$T" || { echo "cannot create $T"; echo "0 passed, 1 failed"; exit 1; }
pass=0 fail=0 skip=0
TO=""; command -v timeout >/dev/null 2>&1 && TO="timeout 120"
ONE="lenet lenet_d2l mlp softmax_regression resnet"   # --device NAME
TRAIN="$ONE model_parallel"                           # model_parallel: --devices A,B

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
# the same file written another way: ./x, a symbolic link (the checkpoint was overwritten by the CSV)
expect 2 "^$B/mlp: --csv $T/a and --svg $T/./a: two outputs in one file" $B/mlp $SHORT --csv "$T/a" --svg "$T/./a"
: > "$T/ck.st"; ln -sf ck.st "$T/cklink.st"
expect 2 "^$B/mlp: --csv $T/./ck.st would overwrite the --resume checkpoint" $B/mlp $SHORT --resume "$T/ck.st" --csv "$T/./ck.st"
expect 2 "^$B/mlp: --svg $T/cklink.st would overwrite the --resume checkpoint" $B/mlp $SHORT --resume "$T/ck.st" --svg "$T/cklink.st"
check "a refused run left the --resume checkpoint alone" test ! -s "$T/ck.st"
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
LC_ALL=C sed 's/"seed":"1"/"seed":"a"/' "$R" > "$T/ck_seed.st"   # (a hand-edited seed; the same length)
expect 1 "^$B/mlp: --resume $T/ck_seed.st: the checkpoint's seed \"a\" is not a whole number$" \
    $B/mlp $SHORT --epochs 2 --resume "$T/ck_seed.st"
rm -f "$T/ck_seed.st"
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

# --- devices: --device NAME in every one-device training example, --devices
# A,B in model_parallel. A bad name: exit 2, the flag, the value and the rule;
# cuda:0 in a build without DL_CUDA: exit 2, the device and DL_CUDA, before
# any training. On cpu:1 (a virtual CPU device, made by asking for it) in
# strict mode, where a host access to its memory faults, a run prints the
# same losses and accuracies as on cpu, bit for bit; so does a model split
# across cpu:0 and cpu:1.
RULE='must be cpu, cpu:N \(N from 0 to 63\) or cuda:N \(N from 0 to 15\)$'
for v in gpu cpu: cpu:-1 cpu:x CPU cuda:1x cpu:64 cuda:16 "cpu 1" ""; do
    expect 2 "^$B/mlp: --device $v: $RULE" $B/mlp $SHORT --device "$v"
done
expect 2 "^$B/mlp: --device needs a value" $B/mlp --device
# the numbers of a run's epoch lines (without the time and the speed)
losses() { printf '%s\n' "$out" | sed -n 's/^\(epoch .*  test acc [0-9.]*\)  .*/\1/p'; }
for e in $ONE; do
    expect 0 "^  --device NAME where the model, the optimizer state and the batches live" $B/$e --help
    expect 2 "^$B/$e: --device gpu: $RULE" $B/$e --device gpu
    expect 2 "^$B/$e: --device cuda:0: cuda:0 requested but dl.h was built without DL_CUDA" $B/$e $SHORT --device cuda:0
    check "$e --device cuda:0: refused before training" eval "! printf '%s\n' \"\$out\" | grep -q '^epoch'"
    expect 0 "^epoch  2  train loss" $B/$e $SHORT --epochs 2
    base=$(losses)
    expect 0 "^device: cpu:1$" env DL_STRICT=1 $B/$e $SHORT --epochs 2 --device cpu:1
    check "$e --device cpu:1 (strict): the same epoch lines as on cpu" eval '[ -n "$base" ] && [ "$(losses)" = "$base" ]'
done
expect 0 "^device: cpu:0$" $B/mlp $SHORT --device cpu:0
# a checkpoint written on cpu:1 resumes on cpu: the run goes on as if never stopped
expect 0 "^epoch  2  train loss" $B/mlp $SHORT --epochs 2
base=$(losses)
expect 0 "^saved to $T/dev\.st$" env DL_STRICT=1 $B/mlp $SHORT --device cpu:1 --save "$T/dev.st"
expect 0 "^resumed from $T/dev\.st at epoch 1$" $B/mlp $SHORT --epochs 2 --resume "$T/dev.st"
check "--save on cpu:1, --resume on cpu: epoch 2 as in one run" \
    eval '[ -n "$base" ] && [ "$(losses)" = "$(printf "%s\n" "$base" | tail -n 1)" ]'
expect 0 "^device: cpu:3$" env DL_STRICT=1 DL_CPU_DEVICES=2 $B/mlp $SHORT --device cpu:3
expect 2 "^$B/model_parallel: unknown flag --device$" $B/model_parallel --device cpu
expect 0 "^  --devices A,B the model's first half on A, its second half on B" $B/model_parallel --help
for v in cpu:0 cpu:0, ,cpu:1 cpu,cpu,cpu; do
    expect 2 "^$B/model_parallel: --devices $v: must be two device names separated by a comma \(cpu:0,cpu:1\)$" \
        $B/model_parallel $SHORT --devices "$v"
done
expect 2 "^$B/model_parallel: --devices cpu,gpu: $RULE" $B/model_parallel $SHORT --devices cpu,gpu
expect 2 "^$B/model_parallel: --devices cuda:0: cuda:0 requested but dl.h was built without DL_CUDA" \
    $B/model_parallel $SHORT --devices cpu,cuda:0
expect 0 "^features on cpu:0, classifier on cpu:0$" $B/model_parallel $SHORT --epochs 2 --devices cpu,cpu
base=$(losses)
expect 0 "^features on cpu:0, classifier on cpu:1$" env DL_STRICT=1 $B/model_parallel $SHORT --epochs 2
check "model_parallel on cpu:0 + cpu:1 (strict): the same epoch lines as on one device" \
    eval '[ -n "$base" ] && [ "$(losses)" = "$base" ]'
check "model_parallel: memory on each device" eval "printf '%s\n' \"\$out\" | grep -q '^memory on cpu:0: ' && printf '%s\n' \"\$out\" | grep -q '^memory on cpu:1: '"
expect 0 "^features on cpu:2, classifier on cpu:1$" env DL_STRICT=1 $B/model_parallel $SHORT --epochs 2 --devices cpu:2,cpu:1
check "model_parallel on cpu:2 + cpu:1 (strict): the same epoch lines" eval '[ "$(losses)" = "$base" ]'

# --- --capture (lenet, resnet): no value; a static graph trains to the same
# epoch lines as the eager loop, bit for bit (64 images, batch 16: the first
# batch eager, the second captured, the rest replayed), on cpu and on the
# strict cpu:1; the other examples do not take it; make run CAPTURE=1
for e in lenet resnet; do
    expect 0 "^  --capture     a static graph \(no value\)" $B/$e --help
    expect 0 "^       \[--device NAME \(cpu\)\] \[--capture\]$" $B/$e --help
    expect 2 "^$B/$e: unknown flag 1$" $B/$e $SHORT --capture 1
    expect 0 "^epoch  2  train loss" $B/$e $SHORT --epochs 2
    base=$(losses)
    expect 0 "^epoch  2  train loss" $B/$e $SHORT --epochs 2 --capture
    check "$e --capture: the same epoch lines as the eager loop" eval '[ -n "$base" ] && [ "$(losses)" = "$base" ]'
    expect 0 "^device: cpu:1$" env DL_STRICT=1 $B/$e $SHORT --epochs 2 --capture --device cpu:1
    check "$e --capture --device cpu:1 (strict): the same epoch lines" eval '[ "$(losses)" = "$base" ]'
    expect 0 "^epoch  1  train loss" $B/$e $SHORT --capture --batch 64
    check "$e --capture, one batch an epoch (never replayed): trains" eval '[ -n "$(losses)" ]'
done
for e in lenet_d2l mlp softmax_regression; do
    expect 2 "^$B/$e: unknown flag --capture$" $B/$e $SHORT --capture
done
SG=$B/static_graph
expect 0 "^usage: $SG \[--device NAME \(cpu\)\]" $SG --help
expect 2 "^$SG: --batch 0: must be a whole number from 1 to 4096$" $SG --batch 0
expect 2 "^$SG: --batch  5: must be a whole number from 1 to 4096$" $SG --batch " 5"
expect 2 "^$SG: --steps 2: must be a whole number from 3 to 100000$" $SG --steps 2
expect 2 "^$SG: --model resnet: must be mlp or lenet$" $SG --model resnet
expect 2 "^$SG: --device gpu: must be cpu, cpu:N \(N 0..63\) or cuda:N \(N 0..15\)$" $SG --device gpu
expect 2 "^$SG: unknown flag --capture$" $SG --capture
expect 2 "^$SG: --steps needs a value$" $SG --steps
expect 2 "^$SG: --device cuda:0: .*built without DL_CUDA" $SG --device cuda:0
expect 0 "^the last loss: [0-9.e-]+ eager, [0-9.e-]+ replayed: the same bits$" $SG --steps 6 --threads 1
check "static_graph: times both ways" eval "printf '%s\n' \"\$out\" | grep -q '^  static (recorded once, replayed) .* ms a step'"
check "static_graph: shows a refusal" eval "printf '%s\n' \"\$out\" | grep -q '^dl_item inside a capture: refused$'"
expect 0 "^the last loss: .* the same bits$" env DL_STRICT=1 $SG --steps 4 --model lenet --batch 4 --device cpu:1
expect 0 "^--capture$" sh -c "${MAKE:-make} -s -n run EPOCHS=1 CAPTURE=1 LOGDIR= | grep -o -- '--capture'"
expect 0 "^none$" sh -c "${MAKE:-make} -s -n run EPOCHS=1 CAPTURE=0 LOGDIR= | grep -q -- '--capture' || echo none"
expect 0 "^none$" sh -c "${MAKE:-make} -s -n run EPOCHS=1 CAPTURE=no LOGDIR= | grep -q -- '--capture' || echo none"
expect 2 "make run: CAPTURE=maybe: must be 1, yes, true or on" ${MAKE:-make} -s -n run EPOCHS=1 CAPTURE=maybe LOGDIR=
expect 0 "--data '/elsewhere/fashion-mnist'" sh -c "DL_DATA_DIR=/elsewhere ${MAKE:-make} -s -n run EPOCHS=1 LOGDIR= 2>/dev/null | grep -o -- \"--data '/elsewhere/fashion-mnist'\""
expect 2 "make fuzz: FUZZ_SECONDS=x: must be a whole number of seconds > 0" ${MAKE:-make} -s fuzz FUZZ_SECONDS=x

# --- 20: --help everywhere, graph --out, "saved to PATH" for each file
for e in $TRAIN custom_function gradcheck graph; do
    expect 0 "^usage: $B/$e " $B/$e --help
done
expect 2 "^$B/custom_function: unknown argument --out" $B/custom_function --out x
expect 2 "^$B/gradcheck: unknown argument x" $B/gradcheck x
expect 2 "^$B/custom_function: unknown argument x:" $B/custom_function --help x
expect 2 "^$B/graph: unknown flag --bogus" $B/graph --bogus
expect 2 "^$B/graph: --out needs a file name" $B/graph --out
expect 2 "^$B/graph: --out /dev/full: a device" $B/graph --out /dev/full
expect 2 "^$B/graph: --out $T/g\.svg: the file is Graphviz DOT text, not SVG: name it \.dot" $B/graph --out "$T/g.svg"
check "graph --out g.svg: refused, nothing written" eval "[ ! -e '$T/g.svg' ]"
expect 0 "^saved to $T/g\.dot$" env PATH="$PWD/$T/nodot:/usr/bin:/bin" $B/graph --out "$T/g.dot"
check "graph: the DOT file" eval "head -n 1 '$T/g.dot' | grep -q '^digraph'"
mkdir -p "$T/bin"
printf '#!/bin/sh\n# fake Graphviz: dot -Tsvg IN -o OUT\necho "<svg/>" > "$4"\n' > "$T/bin/dot"
chmod +x "$T/bin/dot"
expect 0 "^saved to $T/g2\.svg$" env PATH="$PWD/$T/bin:$PATH" $B/graph --out "$T/g2.dot"
check "graph: saved to the .dot too" eval "printf '%s\n' \"\$out\" | grep -q '^saved to $T/g2.dot$'"
# a name that starts with '-' reaches dot as ./-d.dot, not as an option
printf '#!/bin/sh\n[ "$2" = ./-d.dot ] && echo "<svg/>" > "$4"\n' > "$T/bin/dot"
expect 0 "^saved to -d\.svg$" sh -c "cd '$T' && PATH='$PWD/$T/bin':\"\$PATH\" '$PWD/$B/graph' --out -d.dot"
check "graph --out -d.dot: dot read ./-d.dot and the .svg is there" test -s "$T/-d.svg"
printf '#!/bin/sh\n# fake Graphviz: dot -Tsvg IN -o OUT\necho "<svg/>" > "$4"\n' > "$T/bin/dot"
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

# --- T: TensorBoard (--logdir): an events file from every training example
# tfrecord FILE: FILE begins with a whole TFRecord holding the Event
# file_version "brain.Event:2": length 24 (8 bytes, little-endian), the
# length's masked CRC-32C (a37f4b22), the Event, its CRC-32C (4 bytes)
tfrecord() {
    [ -f "$1" ] && [ "$(od -An -tx1 -N12 "$1" | tr -d ' \n')" = 1800000000000000a37f4b22 ] &&
        [ "$(head -c 36 "$1" | tail -c 13)" = brain.Event:2 ] && [ "$(wc -c < "$1")" -ge 40 ]
}
for e in $TRAIN; do
    expect 0 "^TensorBoard: tensorboard --logdir $T/runs/$e$" $B/$e $SHORT --logdir "$T/runs/$e"
    ev=$(printf '%s\n' "$out" | sed -n "s|^saved to \\($T/runs/$e/events\\.out\\.tfevents\\.[^/]*\\)\$|\\1|p")
    check "$e --logdir: 'saved to' the events file, the only file in the directory" \
        eval "[ -n '$ev' ] && [ \"\$(ls -A '$T/runs/$e')\" = '${ev##*/}' ]"
    check "$e --logdir: the events file begins with a valid TFRecord (file_version brain.Event:2)" tfrecord "$ev"
done
check "examples/lenet.c logs the step and the epoch itself" eval "grep -q 'ex_tb_step(s, m, opt, loss)' examples/lenet.c && grep -q 'ex_tb_epoch(&s, &m, net, acc)' examples/lenet.c"
expect 0 "^  --logdir DIR  TensorBoard logs" $B/lenet --help
expect 0 "^LOGDIR: runs/lenet-" env -u LOGDIR sh -c 'echo "LOGDIR: $(${MAKE:-make} -s -n run EPOCHS=1 | tr -d "\047" | sed -n "s/.*--logdir \([^ ]*\).*/\1/p")"'
# the contents, read back by TensorBoard: a 2-epoch run, a resumed run, a cut-off file
L=$T/runs/mlp2
expect 0 "^epoch  2  train loss" $B/mlp $SHORT --epochs 2 --logdir "$L"
printf '%s\n' "$out" > "$T/mlp2.out"
expect 0 "^saved to $T/tbck\.st$" $B/mlp $SHORT --save "$T/tbck.st" --logdir "$T/runs/resumed"
expect 0 "^resumed from $T/tbck\.st at epoch 1$" $B/mlp $SHORT --epochs 2 --resume "$T/tbck.st" --logdir "$T/runs/resumed"
check "a resumed run writes a second events file" [ "$(ls "$T/runs/resumed" | grep -c '^events\.out\.tfevents\.')" = 2 ]
# --- bad --logdir values are refused before anything else (exit 2), nothing is created
: > "$T/afile"
expect 2 "^$B/mlp: --logdir $T/afile: a regular file, not a directory; give a directory \(it is created if missing\)$" \
    $B/mlp $SHORT --logdir "$T/afile"
check "--logdir FILE: refused before training" eval "! printf '%s\n' \"\$out\" | grep -q '^epoch'"
expect 2 "^$B/mlp: --logdir /dev/null: a device, not a directory" $B/mlp --data "$T/nowhere" --logdir /dev/null
expect 2 "^$B/mlp: --logdir $T/afile/run: $T/afile is not a directory$" $B/mlp $SHORT --logdir "$T/afile/run"
expect 2 "^$B/mlp: --logdir needs a path, got ''" $B/mlp $SHORT --logdir ""
expect 2 "^$B/mlp: --csv $T/tbx and --logdir $T/tbx: two outputs in one path$" $B/mlp $SHORT --csv "$T/tbx" --logdir "$T/tbx"
# the same path with a trailing / or /. (was taken for another, and failed after training)
expect 2 "^$B/mlp: --csv $T/tbx and --logdir $T/tbx/: two outputs in one path$" $B/mlp $SHORT --csv "$T/tbx" --logdir "$T/tbx/"
expect 2 "^$B/mlp: --csv $T/tbx and --logdir $T/tbx/.: two outputs in one path$" $B/mlp $SHORT --csv "$T/tbx" --logdir "$T/tbx/."
check "a refused --logdir creates nothing" eval "[ ! -e '$T/tbx' ] && [ -f '$T/afile' ]"
if [ "$(id -u)" != 0 ]; then
    mkdir -p "$T/rotb" && chmod 555 "$T/rotb"
    expect 2 "^$B/mlp: --logdir $T/rotb/run: cannot create a directory in $T/rotb: " $B/mlp $SHORT --logdir "$T/rotb/run"
    expect 2 "^$B/mlp: --logdir $T/rotb: cannot create a file in it: " $B/mlp $SHORT --logdir "$T/rotb"
    chmod 755 "$T/rotb"
elif [ -d /sys ] && ! touch /sys/.dl-test-probe 2>/dev/null; then
    expect 2 "^$B/mlp: --logdir /sys/dl-tb: cannot create a directory in /sys: " $B/mlp $SHORT --logdir /sys/dl-tb
    expect 2 "^$B/mlp: --logdir /sys: cannot create a file in it: " $B/mlp $SHORT --logdir /sys
else
    skipped "test_cli: no unwritable directory for --logdir (root, and /sys is writable)"
fi
# --- a failed write to the events file stops the run (exit 1); the file keeps its whole records
mkdir -p "$T/tbfull"
expect 1 "^$B/mlp: --logdir $T/tbfull/run: dl_summary_[a-z]+: writing $T/tbfull/run/events\.out\.tfevents\.[^ ]+ failed: File too large; .*; stopping$" \
    sh -c 'trap "" XFSZ; ulimit -f 8; exec "$@"' sh $B/mlp $SHORT --epochs 2 --logdir "$T/tbfull/run"
check "--logdir write failed: the run stopped (no 'test accuracy' line)" eval "! printf '%s\n' \"\$out\" | grep -q '^test accuracy'"
if command -v unshare >/dev/null 2>&1 && unshare -rm sh "$T/full.sh" "$T/disk" 0 true >/dev/null 2>&1; then
    expect 1 "^$B/mlp: --logdir $T/disk/tb: dl_summary_[a-z]+: writing .* failed: No space left on device; .*; stopping$" \
        unshare -rm sh "$T/full.sh" "$T/disk" 57344 $B/mlp $SHORT --epochs 2 --logdir "$T/disk/tb"
    check "full disk, --logdir: stopped in epoch 1" eval "! printf '%s\n' \"\$out\" | grep -q '^epoch  2'"
else
    skipped "test_cli: no full filesystem for --logdir (unshare -rm); the failing write is covered with ulimit -f above"
fi
# --- TensorBoard's own reader, when python3 has the tensorboard package
cat > "$T/tb_read.py" <<'EOF'
# tb_read.py MAIN_DIR MAIN_OUTPUT RESUMED_DIR CUT_DIR: prints PASS/FAIL lines, then DONE
import math, os, re, struct, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import event_file_loader as efl
main, main_out, resumed, cut = sys.argv[1:5]

def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)

T = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    T.append(c)

def masked_crc(b):
    c = 0xFFFFFFFF
    for x in b:
        c = T[(c ^ x) & 255] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def whole_records(path):
    """every record framed right with both CRCs, and nothing after the last"""
    data = open(path, "rb").read()
    i = n = 0
    while i < len(data):
        if i + 12 > len(data):
            return -1
        ln, lc = struct.unpack_from("<QI", data, i)
        if lc != masked_crc(data[i:i + 8]) or i + 16 + ln > len(data):
            return -1
        if struct.unpack_from("<I", data, i + 12 + ln)[0] != masked_crc(data[i + 12:i + 12 + ln]):
            return -1
        i += 16 + ln
        n += 1
    return n

def files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if ".tfevents." in f)

# the 2-epoch mlp run: 64 images, batch 16: 4 steps an epoch
f = files(main)
check(len(f) == 1 and whole_records(f[0]) > 0, "the events file: whole records, CRCs right")
a = ea.EventAccumulator(main, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
a.Reload()
tags = a.Tags()
check(sorted(tags["scalars"]) == ["test/accuracy", "train/accuracy", "train/loss", "train/lr"],
      "the scalar tags: %s" % tags["scalars"])
ep = [l.split() for l in open(main_out) if l.startswith("epoch ")]
loss = a.Scalars("train/loss") if "train/loss" in tags["scalars"] else []
check([s.step for s in loss] == list(range(8)), "train/loss at steps 0..7")
check(len(loss) == 8 and len(ep) == 2 and all(abs(sum(s.value for s in loss[4 * k:4 * k + 4]) / 4 - float(ep[k][4])) < 2e-4
      for k in range(2)), "train/loss: each epoch's mean is the epoch line's train loss")
lr = [s.value for s in a.Scalars("train/lr")] if "train/lr" in tags["scalars"] else []
check(len(lr) == 8 and all(abs(v - w) < 1e-7 for v, w in zip(lr, [0.05] * 4 + [0.025] * 4)),
      "train/lr: 0.05, then 0.025 (cosine over 2 epochs)")
for tag, col in (("train/accuracy", 7), ("test/accuracy", 10)):
    v = a.Scalars(tag) if tag in tags["scalars"] else []
    check([s.step for s in v] == [4, 8] and all(abs(s.value - float(e[col])) < 1e-4 for s, e in zip(v, ep)),
          "%s at steps 4, 8: the epoch lines' values" % tag)
names = ["1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias"]
check(tags["histograms"] == names, "a histogram per parameter, tagged by its state_dict name: %s" % tags["histograms"])
h = [a.Histograms(n) for n in names] if tags["histograms"] == names else []
check(h and all([x.step for x in v] == [4, 8] for v in h) and
      [sum(v[k].histogram_value.num for v in h) for k in range(2)] == [235146, 235146],
      "the histograms at steps 4, 8 count the 235146 parameters")
g = a.Graph() if tags["graph"] else None
check(g is not None and "1.weight" in [n.name for n in g.node] and any(n.op == "dl_matmul" for n in g.node),
      "the graph: parameters by name, the ops")
# the resumed run: its second file goes on counting steps
s = []
for p in files(resumed):
    s.append(sorted(e.step for e in efl.EventFileLoader(p).Load()
                    for v in e.summary.value if v.tag == "train/loss"))
check(sorted(s) == [[0, 1, 2, 3], [4, 5, 6, 7]], "resumed: train/loss at steps 0..3, then 4..7 in a new file: %s" % s)
# the file of the run stopped by a failed write
f = files(cut)
check(len(f) == 1 and whole_records(f[0]) > 1, "cut off by a failed write: the file holds whole records only")
print("DONE")
EOF
if python3 -c 'import tensorboard' >/dev/null 2>&1; then
    res=$(python3 "$T/tb_read.py" "$L" "$T/mlp2.out" "$T/runs/resumed" "$T/tbfull/run" 2>&1)
    while IFS= read -r line; do
        case $line in PASS*) ok ;; FAIL*) no "TensorBoard's reader: ${line#FAIL }" ;; esac
    done <<EOF
$res
EOF
    check "tb_read.py ran to the end" eval "printf '%s\n' \"\$res\" | grep -q '^DONE$' || { printf '%s\n' \"\$res\" | tail -n 5; false; }"
else
    skipped "test_cli: python3 has no tensorboard package (pip install tensorboard): the events files are not read back here (test_summary checks dl.h's writer)"
fi

# --- 22: test_smoke without the data says it skipped; run.sh sums skips
mkdir -p "$T/nodata"
expect 0 "^0 passed, 0 failed, 1 skipped$" sh -c 'cd "$1" && exec "$2"' sh "$T/nodata" "$PWD/$B/test_smoke"
check "test_smoke says why it skipped" eval "printf '%s\n' \"\$out\" | grep -q '^SKIP .*not found'"
printf '#!/bin/sh\necho "3 passed, 0 failed, 2 skipped"\n' > "$T/t1"
printf '#!/bin/sh\necho "4 passed, 0 failed"\n' > "$T/t2"
chmod +x "$T/t1" "$T/t2"
expect 0 "^7 passed, 0 failed, 2 skipped$" tests/run.sh "$T/t1" "$T/t2"
expect 0 "^4 passed, 0 failed$" tests/run.sh "$T/t2"

# --- data_parallel: its own flags (--devices), and a run on 1 and 2 devices
DP=$B/data_parallel
expect 2 "^$DP: --devices gpu:1: 'gpu:1' is not a device like cpu:1 or cuda:0" $DP --devices gpu:1
expect 2 "^$DP: --devices cpu:1,cpu:1: 'cpu:1' appears twice \(one replica per device\)" $DP --devices cpu:1,cpu:1
expect 2 "^$DP: --devices '': needs at least one device" $DP --devices ""
expect 2 "^$DP: --epochs 0: must be a whole number from 1 to 1000" $DP --epochs 0
expect 2 "^$DP: --batch 3: must be at least twice the number of devices of every run" $DP --batch 3
# a replica's batch norm needs 2 rows: refused before any work (it failed at step 1,
# and with --ranks the other rank then waited out the 300 s timeout)
expect 2 "^$DP: --batch 3: must be at least twice the number of devices of every run \(times --ranks\): each replica's batch norm needs 2 rows" \
    $DP --data "$D" --ranks 2 --batch 3
expect 2 "^$DP: --lr -1: must be a finite number > 0" $DP --lr -1
expect 2 "^$DP: --lr  0.5: must be a finite number > 0" $DP --lr " 0.5"
expect 2 "^$DP: --data '': needs a directory" $DP --data ""
expect 2 "^$DP: unknown flag --device" $DP --device cpu:0
expect 0 "^usage: $DP \[--devices LIST\]" $DP --help
expect 0 "^cpu:0,cpu:1 +[0-9.]+ +[01]\.[0-9]{4} +[0-9.]+x$" $DP --data "$D" --epochs 1 --batch 16 \
    --devices cpu:0 --devices cpu:0,cpu:1
check "data_parallel: an epoch line per run" eval "[ \$(printf '%s\n' \"\$out\" | grep -c '^  epoch 1 ') = 2 ]"
# --limit leaving no batch big enough for every replica: an error, not a result of nothing
expect 1 "^$DP: --limit 7, --batch 8: no batch gives each of the 4 replicas 2 rows \(batch norm\); nothing was trained$" \
    $DP --data "$D" --epochs 1 --limit 7 --batch 8 --devices cpu:0,cpu:1,cpu:2,cpu:3
expect 2 "^$DP: --ranks 17: must be a whole number from 0 to 16" $DP --ranks 17
# missing data with --ranks: one message, not one per rank
expect 1 "^$DP: dl_idx_load: cannot open '$T/none/train-images-idx3-ubyte'" $DP --data "$T/none" --ranks 4
check "data_parallel --ranks 4 without data: the message once" \
    eval "[ \$(printf '%s\n' \"\$out\" | grep -c 'cannot open') = 1 ]"
expect 2 "^$DP: --batch 7: must be at least twice the number of devices of every run \(times --ranks\)" $DP --ranks 4 --batch 7
expect 0 "^cpu:0 +[0-9.]+ +[01]\.[0-9]{4} +[0-9.]+x$" $DP --data "$D" --epochs 1 --batch 16 --ranks 2 --threads 1
check "data_parallel --ranks 2: two thread ranks train one model" eval "printf '%s\n' \"\$out\" | grep -q '^LeNet-BN on cpu:0 in each of the thread ranks: 2 replicas, batch 16 (8 per replica)'"
expect 2 "^$DP: --bucket-kb -1: must be a whole number from 0 to 1048576" $DP --bucket-kb -1
expect 2 "^$DP: --bucket-kb 1048577: must be a whole number from 0 to 1048576" $DP --bucket-kb 1048577
expect 0 "^cpu:0 +[0-9.]+ +[01]\.[0-9]{4} +[0-9.]+x$" $DP --data "$D" --epochs 1 --batch 16 --ranks 2 --threads 1 \
    --bucket-kb 16
# devices that do not exist, and empty names, are usage errors before any work
expect 2 "^$DP: --devices cpu:64: 'cpu:64' does not exist: CPU devices go from cpu:0 to cpu:63$" $DP --devices cpu:64
expect 2 "^$DP: --devices cpu:0,cuda:0: cuda:0 requested but dl.h was built without DL_CUDA" \
    $DP --data "$D" --devices cpu:0,cuda:0
for v in cpu:0,,cpu:1 cpu:0, ,cpu:1; do
    expect 2 "^$DP: --devices $v: an empty device name \(two commas, or one at an end\)$" $DP --devices "$v"
done
# a batch that --ranks does not divide: near-equal parts (64 = 22 + 21 + 21), no row left out
expect 0 "^LeNet-BN on cpu:0 in each of the thread ranks: 3 replicas, batch 64 \(21-22 per replica\)" \
    $DP --data "$D" --epochs 1 --batch 64 --ranks 3 --threads 1
check "data_parallel --ranks 3 --batch 64: the run's line" eval "printf '%s\n' \"\$out\" | grep -qE '^cpu:0 +[0-9.]+ +[01]\.[0-9]{4} +[0-9.]+x$'"
# a data set too large for memory (ulimit -v): dl.h's message, without the "make data" hint
BIG=$T/bigdata
mkdir -p "$BIG"
{ printf '\000\000\010\003'; be32 40000; be32 28; be32 28; head -c $((40000 * 784)) /dev/zero; } > "$BIG/train-images-idx3-ubyte"
{ printf '\000\000\010\001'; be32 40000; head -c 40000 /dev/zero; } > "$BIG/train-labels-idx1-ubyte"
expect 1 "^$B/mlp: dl_idx_load: cannot allocate 125440000 bytes" \
    sh -c 'ulimit -v 90000; exec "$@"' sh $B/mlp --data "$BIG" --epochs 0 --workers 0 --threads 1
check "no memory for the data: no 'run make data' hint" eval "! printf '%s\n' \"\$out\" | grep -q 'make data'"
rm -rf "$BIG"
expect 1 "^\(run \`make data\` to fetch Fashion-MNIST, or give --data DIR\)$" $B/mlp --data "$T/nowhere"
# a test split whose labels are not classes 0..9 (scored 0.0000, exit 0, before), an empty split
BADL=$T/badlabels
mkdata "$BADL"
{ printf '\000\000\010\001'; be32 64; head -c 63 /dev/zero; printf '\310'; } > "$BADL/t10k-labels-idx1-ubyte"
expect 1 "^$B/mlp: $BADL/t10k-labels-idx1-ubyte: label 63 is 200: Fashion-MNIST's classes are 0..9$" \
    $B/mlp --data "$BADL" --epochs 1 --batch 16
{ printf '\000\000\010\003'; be32 0; be32 28; be32 28; } > "$BADL/t10k-images-idx3-ubyte"
{ printf '\000\000\010\001'; be32 0; } > "$BADL/t10k-labels-idx1-ubyte"
expect 1 "^$B/mlp: $BADL/t10k-images-idx3-ubyte holds no images$" $B/mlp --data "$BADL" --epochs 1 --batch 16
rm -rf "$BADL"

# --- every example on the strict cpu:1 (a virtual device whose memory the host
# cannot address: a host dereference of tensor data faults), as make test runs
# the C tests: each runs to the end (exit 0)
STRICT="env DL_CPU_DEVICES=2 DL_DEVICE=cpu:1 DL_STRICT=1"
for e in $TRAIN; do
    expect 0 "^test accuracy: [01]\.[0-9]{4}$" $STRICT $B/$e $SHORT
done
expect 0 "^cpu:1 +[0-9.]+ +[01]\.[0-9]{4} +[0-9.]+x$" $STRICT $DP --data "$D" --epochs 1 --batch 16 --devices cpu:1
expect 0 "^cpu:0,cpu:1 +[0-9.]+ +[01]\.[0-9]{4} +[0-9.]+x$" $STRICT $DP --data "$D" --epochs 1 --batch 16 \
    --devices cpu:0,cpu:1
expect 0 "^gradcheck passed" $STRICT $B/gradcheck
expect 0 "^saved to $T/strict\.dot$" $STRICT env PATH="$PWD/$T/nodot:/usr/bin:/bin" $B/graph --out "$T/strict.dot"
expect 0 "^  cpu:0 +[0-9.]+ us$" $STRICT $B/transfer_cost
expect 0 "^MLP with dropout on cpu:1, " $STRICT $B/static_graph --steps 4 --batch 4
check "static_graph on cpu:1: the same bits both ways" eval "printf '%s\n' \"\$out\" | grep -q 'replayed: the same bits$'"
expect 2 "^$B/static_graph: --batch 1: the lenet model's batch norm needs at least 2 samples a step$" \
    $B/static_graph --model lenet --batch 1
# custom_function: the Function written with dl ops runs on cpu:1; the one
# written with host loops runs on cpu:0 only, and on cpu:1 says why not
expect 0 "^MySigmoid vs the built-in: .* -> ok$" $STRICT $B/custom_function
check "custom_function on cpu:1: HostSquare refused with dl_data's reason" eval "printf '%s\n' \"\$out\" | grep -q '^HostSquare on cpu:1: dl_data: t (4,5) is on cpu:1, whose memory the host cannot address'"
expect 0 "^HostSquare vs the built-in: .* -> ok$" $B/custom_function
check "custom_function on cpu:0: MySigmoid too" eval "printf '%s\n' \"\$out\" | grep -q '^MySigmoid vs the built-in: .* -> ok$'"
# a non-strict cpu:1 is host memory: the host variant runs there too (it exited 1)
expect 0 "^HostSquare vs the built-in: .* -> ok$" env DL_CPU_DEVICES=2 DL_DEVICE=cpu:1 $B/custom_function
# whole numbers in range, named with the flag (atoi took 5abc as 5, 4294967496 as 200)
expect 2 "^$B/transfer_cost: --n 5abc: must be a whole number from 1 to 8192$" $B/transfer_cost --n 5abc
expect 2 "^$B/transfer_cost: --n 4294967496: must be a whole number from 1 to 8192$" $B/transfer_cost --n 4294967496
expect 2 "^$B/transfer_cost: --reps needs a value$" $B/transfer_cost --reps
# a batch norm model and a last batch of one sample: refused before training (it failed after an epoch)
expect 2 "^$B/lenet: --batch 16 with 17 training samples \(--limit\) leaves a batch of one sample" \
    $B/lenet --data "$D" --epochs 1 --batch 16 --limit 17
expect 2 "^$B/lenet: --save $T/e0.st with --epochs 0: no epoch runs" $B/lenet --data "$D" --epochs 0 --save "$T/e0.st"
# transformer: the shared flags that fit (its data is made up as it trains:
# no --data, --save ...), each value checked as in the others; one epoch on
# cpu (1 thread) and on the strict cpu:1 (2 threads): the same epoch line
TR=$B/transformer
expect 0 "^usage: $TR \[--epochs N \(6\)\] \[--batch N \(64\)\] \[--lr F \(0.006\)\] \[--threads N \(0\)\]$" $TR --help
for bad in "--epochs abc" "--epochs 1001" "--batch 0" "--batch 65537" "--lr 0" "--lr nan" "--threads -1" \
           "--threads 1025" "--seed -1"; do
    set -- $bad
    expect 2 "^$TR: $1 $2: must be a" $TR $bad
done
expect 2 "^$TR: unknown flag --data$" $TR --data "$D"
expect 2 "^$TR: --epochs needs a value$" $TR --epochs
expect 2 "^$TR: --device gpu: $RULE" $TR --device gpu
expect 2 "^$TR: --device cuda:0: cuda:0 requested but dl.h was built without DL_CUDA" $TR --device cuda:0
expect 0 "^epoch  1  train loss [0-9.]+  train acc [0-9.]+  test acc [0-9.]+  " $TR --epochs 1 --batch 256 --threads 1
base=$(losses)
check "transformer: a sorted sample, then the test accuracy" eval "printf '%s\n' \"\$out\" | tail -n 2 | head -n 1 | grep -qE '^sorted by the model:( [0-9])+ \|( [0-9])+$' && printf '%s\n' \"\$out\" | tail -n 1 | grep -qE '^test accuracy: [01]\.[0-9]{4}$'"
expect 0 "^test accuracy: [01]\.[0-9]{4}$" $STRICT $TR --epochs 1 --batch 256 --threads 2
check "transformer on cpu:1 (strict), 2 threads: the same epoch line as on cpu, 1 thread" \
    eval '[ -n "$base" ] && [ "$(losses)" = "$base" ]'
expect 1 "^$TR: the loss is (NaN|infinite) at epoch 1, step [0-9]+ of 16: training diverged" \
    $TR --epochs 1 --batch 256 --lr 1e38 --threads 1
expect 1 "^$TR: writing standard output: No space left on device$" sh -c "exec $TR --epochs 0 >/dev/full"
all=$(ls examples/*.c | sed 's|^examples/||; s|\.c$||' | tr '\n' ' ')
check "every example is run on the strict cpu:1 above (a new one: add it there): $all" \
    [ "$all" = "custom_function data_parallel gradcheck graph lenet lenet_d2l mlp model_parallel resnet softmax_regression static_graph transfer_cost transformer " ]

# --- a short run on the real data, when it is there
if [ -f data/fashion-mnist/train-images-idx3-ubyte ]; then
    expect 0 "^LeNet-BN on Fashion-MNIST: 62158 parameters, 512 train / 10000 test samples, batch 64" \
        $B/lenet --limit 512 --epochs 1 --batch 64
    check "lenet on real data: the epoch line and the accuracy" eval "printf '%s\n' \"\$out\" | tail -n 2 | head -n 1 | grep -q '^epoch  1  train loss' && printf '%s\n' \"\$out\" | tail -n 1 | grep -qE '^test accuracy: 0\.[0-9]{4}$'"
else
    skipped "test_cli: data/fashion-mnist not found, no run on the real data (run \`make data\`)"
fi

# --- d2l's ResNet-18 (examples/resnet18.h): resnet.c --arch d2l, data_parallel
# --model resnet18 on two devices, 2 steps of 4 made-up images (the CPU's
# share of the two-GPU experiment), the test set of 64
expect 2 "^$B/resnet: --arch vgg: must be small or d2l$" $B/resnet --arch vgg
expect 2 "^$B/resnet: --arch needs a value$" $B/resnet --epochs 1 --arch
expect 2 "^$B/resnet: --arch needs a value$" $B/resnet --arch --epochs 1   # (it took --epochs as the value)
expect 0 "^  --arch NAME   small \(widths 16-32-64-128, batch 128\) or d2l" $B/resnet --help
expect 0 "^d2l ResNet-18 on Fashion-MNIST: 11175818 parameters, 8 train / 64 test samples, batch 4" \
    $B/resnet --data "$D" --arch d2l --epochs 1 --limit 8 --batch 4
check "resnet --arch d2l: an epoch, then the accuracy" eval "printf '%s\n' \"\$out\" | grep -q '^epoch  1  train loss' && printf '%s\n' \"\$out\" | tail -n 1 | grep -qE '^test accuracy: [01]\.[0-9]{4}$'"
expect 2 "^$DP: --model vgg: must be lenet_bn or resnet18" $DP --model vgg
expect 0 "^cpu:0,cpu:1 +[0-9.]+ +[01]\.[0-9]{4} +[0-9.]+x$" $DP --data "$D" --model resnet18 --devices cpu:0,cpu:1 \
    --epochs 1 --limit 8 --batch 4
check "data_parallel --model resnet18: 2 replicas of d2l's ResNet-18" eval "printf '%s\n' \"\$out\" | grep -q '^d2l ResNet-18 on cpu:0,cpu:1: 2 replicas, batch 4 (2 per replica)'"
base=$(printf '%s\n' "$out" | grep '^  epoch 1 ' | sed 's/  [0-9.]* s .*//')
expect 0 "^cpu:1,cpu:2 +[0-9.]+" env DL_STRICT=1 $DP --data "$D" --model resnet18 --devices cpu:1,cpu:2 --epochs 1 \
    --limit 8 --batch 4
check "data_parallel --model resnet18 on cpu:1,cpu:2 (strict; the data on cpu:1): the same epoch line" \
    eval '[ -n "$base" ] && [ "$(printf "%s\n" "$out" | grep "^  epoch 1 " | sed "s/  [0-9.]* s .*//")" = "$base" ]'

# --- a hostile review of the command lines (2026-11-29)
# standard output that cannot be written fails the run (it exited 0, the
# accuracy line lost), in every program
expect 1 "^$B/mlp: writing standard output: No space left on device$" sh -c "exec $B/mlp $SHORT >/dev/full"
expect 1 "^$B/gradcheck: writing standard output: No space left on device$" sh -c "exec $B/gradcheck >/dev/full"
expect 1 "^$B/transfer_cost: writing standard output: " sh -c "exec $B/transfer_cost --n 4 --reps 1 >/dev/full"
# a flag given twice: the last one counts (as in most Unix tools)
expect 0 "^epoch  2 " $B/mlp $SHORT --epochs 2
# a batch of one on a batch-norm model: refused before training (--batch 1 slipped through)
expect 2 "^$B/lenet: --batch 1 with 64 training samples \(--limit\) leaves a batch of one sample" \
    $B/lenet --data "$D" --epochs 1 --batch 1
# ... but the ResNets' BatchNorm2d sees 4x4 maps or larger: a batch of one trains, as in PyTorch
expect 0 "^test accuracy: [01]\.[0-9]{4}$" $B/resnet --data "$D" --epochs 1 --limit 3 --batch 1
# an explicit --device is not overridden by DL_DEVICE (cpu:3 did not exist in its context)
expect 0 "^device: cpu:1$" env DL_DEVICE=cpu:3 DL_CPU_DEVICES=4 $B/mlp $SHORT --device cpu:1
# a resumed run with every epoch done and --save: it wrote nothing and exited 0
expect 0 "^saved to $T/done.st$" $B/mlp $SHORT --save "$T/done.st"
expect 1 "^$B/mlp: --resume $T/done.st --save $T/new.st: the checkpoint has all 1 epochs done, so no epoch runs" \
    $B/mlp $SHORT --resume "$T/done.st" --save "$T/new.st"
check "nothing written" test ! -e "$T/new.st"
expect 2 "^$B/static_graph: --device cuda:20: must be cpu, cpu:N \(N 0..63\) or cuda:N \(N 0..15\)$" \
    $B/static_graph --device cuda:20

rm -rf "$T"
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]

# Prints each GPU whose persistence mode is not Enabled, as "GPU <index> (<mode>)", from one nvidia-smi
# query of all the GPUs; nothing when every GPU has it. A failed query fails the script (its exit status).
modes=$(timeout 60 nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader) || exit
while IFS=', ' read -r index mode; do
  [ -z "$index" ] || [ "$mode" = Enabled ] || echo "GPU $index ($mode)"
done <<EOF_MODES
$modes
EOF_MODES

# resp(words, key): one command as a client sends it in RESP, `words` split on
# spaces, the word KEY standing for `key` and OWNER for the variable `owner`.
# Shared by bench/module-floor.sh and bench/footprint.sh (awk -f bench/resp.awk
# -f <their program>).
function resp(words, key,    w, k, j, a) {
    k = split(words, w, " ")
    printf "*%d\r\n", k
    for (j = 1; j <= k; j++) {
        a = w[j]
        if (a == "KEY") a = key
        else if (a == "OWNER") a = owner
        printf "$%d\r\n%s\r\n", length(a), a
    }
}

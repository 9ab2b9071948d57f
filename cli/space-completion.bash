# Bash completion for `space` (source it: `. build/bin/space-completion.bash`, or copy it to
# /etc/bash_completion.d/space). Commands, each command's options, and sandbox ids from
# `space ls` (through the API of $SPACE_HOME/space.env or SPACE_API_URL/SPACE_API_KEY) where
# an id goes.

_space_ids() {
    space ls 2>/dev/null | awk 'NR > 1 { print $1 }'
}

_space() {
    local cur prev cmd
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD - 1]}
    cmd=${COMP_WORDS[1]:-}
    local commands="up down status env demo create ls rm exec cp events identity platform creds keys help"
    if [ "$COMP_CWORD" -eq 1 ]; then
        mapfile -t COMPREPLY < <(compgen -W "$commands --help" -- "$cur")
        return
    fi
    case $prev in
    --template)
        mapfile -t COMPREPLY < <(compgen -W "tiny base" -- "$cur")
        return
        ;;
    --user)
        mapfile -t COMPREPLY < <(compgen -W "root user" -- "$cur")
        return
        ;;
    --network)
        mapfile -t COMPREPLY < <(compgen -W "deny_all allow_all allowlist" -- "$cur")
        return
        ;;
    --cwd | --env | --timeout | --metadata | --allow | --deny | --tenant | --name | --state)
        return
        ;;
    --home)
        mapfile -t COMPREPLY < <(compgen -d -- "$cur")
        return
        ;;
    esac
    local opts=""
    case $cmd in
    create) opts="--template --timeout --metadata --env --allow --deny --network --json --help" ;;
    ls) opts="--state --metadata --json --help" ;;
    rm) opts="--help" ;;
    exec) opts="--env --cwd --user --timeout -t --tty -n --no-stdin --help" ;;
    cp) opts="-r --help" ;;
    events) opts="--follow --help" ;;
    keys) opts="create ls revoke --tenant --name --admin --json --help" ;;
    creds) opts="add ls rm rotate rotate-master --json --help" ;;
    identity) opts="add ls conf rotate" ;;
    platform) opts="add ls publish --tenants --tenant" ;;
    down) opts="--purge --home --help" ;;
    help) opts="create ls rm exec cp events creds keys" ;;
    *) opts="--home --help" ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        return
    fi
    case $cmd in
    rm | events)
        mapfile -t COMPREPLY < <(compgen -W "$(_space_ids)" -- "$cur")
        ;;
    exec)
        # The id is the first word after exec that is no option.
        local i seen=0
        for ((i = 2; i < COMP_CWORD; i++)); do
            [[ ${COMP_WORDS[i]} == -* ]] || seen=1
        done
        [ "$seen" -eq 0 ] && mapfile -t COMPREPLY < <(compgen -W "$(_space_ids)" -- "$cur")
        ;;
    cp)
        mapfile -t COMPREPLY < <(compgen -f -- "$cur"; compgen -W "$(_space_ids | sed 's/$/:/')" -- "$cur")
        compopt -o nospace 2>/dev/null
        ;;
    *)
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        ;;
    esac
}
complete -F _space space

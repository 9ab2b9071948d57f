# Turns a file into a C array (cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake):
# the gateway serves api/openapi.json from its own binary, so what it serves is the repo's
# document of the commit it was built from. Only cmake: no xxd, no network.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp"
     "/* Generated from ${IN} by gateway-api/embed.cmake: do not edit. */\n"
     "#include <stddef.h>\n\n"
     "extern const unsigned char ${NAME}[];\n"
     "extern const size_t ${NAME}_len;\n"
     "const unsigned char ${NAME}[] = {\n${bytes}0x00};\n"
     "const size_t ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")

/* libjpeg error handling shared by shardkit's C extensions: errors jump back to the caller with
 * libjpeg's message (no exit()), warnings are counted (corrupt data makes a result untrustworthy). */
#ifndef SHARDKIT_JPEG_ERRORS_H
#define SHARDKIT_JPEG_ERRORS_H
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>

struct error_manager {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct error_manager *err = (struct error_manager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) cinfo->err->num_warnings++;
}
#endif
